"""JSON schema preparation shared by both backends: keyword checks, $ref / allOf folding, bounds, names.

    check, normalise, numeric_regex, pattern_check   what a schema may hold, normalised for the compilers
    logic, branches, closing, names                  boolean logic, branches, closed objects, property names
"""
