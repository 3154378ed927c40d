"""Running a model on CPU with row-invariant numerics: a token's logits never depend on the rest of the pass.

    model_runtime  ModelRuntime: packed passes over many sequences, each with its own KV
    packed         ragged passes: many sequences in one forward, each attending to its own KV (row_attention.cpp)
    quantized      GGUF block formats kept as they ship, on the blockq_linear.cpp kernel
    gguf_model     GGUF file -> transformers' own model class with quantized linears
    fixed_linear   the float32 fixed-order linear kernel (fixed_linear.cpp); linear: its oneDNN fallback
    draft_int8     a float draft in weight-only int8 on the fixed-order kernel
    native         building and loading csrc/*.cpp once per machine
    openmp         only the computing thread keeps an OpenMP pool
    load_memory    mapped weights, page-out and heap trimming while loading
    kv/            prefix cache, KV tiers and spill store
"""
