#pragma once
// Pass kinds are types (clover-diffusion.md §2). A layer has one `forward` overload per pass it
// supports, so asking a layer for a pass it does not have fails to compile.
//   commit  — causal; writes the session (KV rows, GDN state, conv ring)
//   preview — the B rows of a diffusion block; reads the clean prefix state, never writes it
//   verify  — causal over drafted rows; its state changes are rolled back by the decoder
namespace clover {

struct commit_pass {
    static constexpr bool writes_state = true;
};
struct preview_pass {
    static constexpr bool writes_state = false;
};
struct verify_pass {
    static constexpr bool writes_state = true;  // written, then rolled back
};

}  // namespace clover
