// mma.sync.aligned.m16n8k32 / m16n8k16 .row.col.s32.s8.s8.s32 for one warp, written from the PTX
// ISA's fragment tables ("Matrix Fragments for mma.m16n8k32" / "mma.m16n8k16", integer types),
// element by element, and independently of mma.cuh's frag_* functions: with
// groupID = laneid >> 2 and threadID_in_group = laneid % 4, element i of a lane's fragment (a
// register holds four, element i in byte i % 4, low to high) sits at
//   m16n8k32 A (16×32): row = groupID for i < 4 or 8 <= i < 12, else groupID + 8;
//                       col = threadID_in_group·4 + (i & 3), + 16 when i >= 8
//            B (32×8):  row = threadID_in_group·4 + (i & 3), + 16 when i >= 4; col = groupID
//   m16n8k16 A (16×16): row = groupID for i < 4, else groupID + 8; col = threadID_in_group·4 + (i & 3)
//            B (16×8):  row = threadID_in_group·4 + i; col = groupID
//   C/D (16×8, both):   row = groupID for i < 2, else groupID + 8; col = threadID_in_group·2 + (i & 1)
#include "internal.hpp"

namespace clover_emu::detail {

void mma_compute(int k, const std::uint32_t (&a)[32][4], const std::uint32_t (&b)[32][2], int (&d)[32][4]) {
    int A[16][32] = {}, B[32][8] = {};
    auto byte = [](std::uint32_t r, int i) { return int(std::int8_t(r >> (8 * (i % 4)))); };
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, tg = lane % 4;
        const int a_elems = k == 32 ? 16 : 8, b_elems = k == 32 ? 8 : 4;
        for (int i = 0; i < a_elems; ++i) {
            int row, col;
            if (k == 32) {
                row = (i < 4 || (i >= 8 && i < 12)) ? g : g + 8;
                col = tg * 4 + (i & 3) + (i >= 8 ? 16 : 0);
            } else {
                row = i < 4 ? g : g + 8;
                col = tg * 4 + (i & 3);
            }
            A[row][col] = byte(a[lane][i / 4], i);
        }
        for (int i = 0; i < b_elems; ++i) {
            const int row = k == 32 ? tg * 4 + (i & 3) + (i >= 4 ? 16 : 0) : tg * 4 + i;
            B[row][g] = byte(b[lane][i / 4], i);
        }
    }
    for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, tg = lane % 4;
        for (int i = 0; i < 4; ++i) {
            const int row = i < 2 ? g : g + 8, col = tg * 2 + (i & 1);
            int s = 0;
            for (int kk = 0; kk < k; ++kk) s += A[row][kk] * B[kk][col];
            d[lane][i] = s;
        }
    }
}

}  // namespace clover_emu::detail
