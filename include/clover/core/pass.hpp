#pragma once
// Pass kinds (clover-diffusion.md §2) and sequence handles: the words every level of the engine
// shares, below layers, backends and the model.
//   commit  — causal; writes the sequence's state (KV rows, GDN state, conv ring)
//   verify  — causal over drafted rows, computed row by row exactly as AR decoding would; writes
//             the state and keeps a record so the decoder can roll back to any prefix
//   preview — the B rows of a diffusion block; reads the clean prefix state, never writes it
#include <cstdint>

namespace clover {

using token = std::int32_t;

// A sequence in a backend's state pool (its KV page table, GDN slot, checkpoints).
using seq_id = std::int32_t;

enum class pass_kind : std::uint8_t { commit, verify, preview };

inline const char* pass_name(pass_kind k) {
    switch (k) {
        case pass_kind::commit: return "commit";
        case pass_kind::verify: return "verify";
        case pass_kind::preview: return "preview";
    }
    return "?";
}

// Tag types, for overloads that exist for one kind only.
struct commit_pass {
    static constexpr pass_kind kind = pass_kind::commit;
    static constexpr bool writes_state = true;
};
struct preview_pass {
    static constexpr pass_kind kind = pass_kind::preview;
    static constexpr bool writes_state = false;
};
struct verify_pass {
    static constexpr pass_kind kind = pass_kind::verify;
    static constexpr bool writes_state = true;  // written, then rolled back
};

}  // namespace clover
