// AMX tile instructions as blockq_linear.cpp writes them (and benchmarks/csrc/amx_parts.cpp, its probe, includes
// them from here): each names the memory it reads or writes as an operand. The compiler's own intrinsics name none,
// so it could move the tile loads and stores across the plain ones around them; a "memory" clobber instead makes it
// keep the accumulators in memory, a load and a store per row and group.
#pragma once
#include <cstdint>

using TileBytes = uint8_t[1024];  // the most bytes a tile load or store here touches (16 rows x 64 bytes)
#define TILE_LOAD(t, base, stride)                                                                 \
  asm volatile("tileloadd (%1,%2,1), %%tmm" #t ::"m"(*reinterpret_cast<const TileBytes*>(base)), \
               "r"(base), "r"((int64_t)(stride)))
#define TILE_STORE(t, base, stride)                                                              \
  asm volatile("tilestored %%tmm" #t ", (%1,%2,1)" : "=m"(*reinterpret_cast<TileBytes*>(base)) \
               : "r"(base), "r"((int64_t)(stride)))
#define TILE_ZERO(t) asm volatile("tilezero %%tmm" #t ::)
#define TILE_DPBSUD(c, a, b) asm volatile("tdpbsud %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#define TILE_DPBSSD(c, a, b) asm volatile("tdpbssd %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)

// LDTILECFG's 64-byte operand: palette 1, then each tile's bytes per row and rows.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// The 16 rows of a block, each with its own accumulator variable (an array of them would live in memory: the
// compiler keeps an array whose address a call takes on the stack, a load and a store per row and group).
#define ROWS16(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15)
