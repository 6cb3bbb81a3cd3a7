#pragma once
// Known variants of real qwen35moe / clover_moe GGUF files (clover-diffusion.md §6), how to tell
// them, and how to make them canonical — in memory (load_canonical) or on disk (patch_file,
// `clover gguf patch IN OUT`).
//
// The variants, and how each is told:
//  - `clover_moe.expert_shared_count` missing: the key is absent (1 is implied).
//  - norms without the +1 (a converter that skipped §3.4's fold): canonical RMSNorm weights sit
//    around 1, zero-centred ones around 0. Each *norm.weight tensor but ssm_norm (which never
//    had the +1) gets its mean; the file's median of those below 0.5 means "not folded".
//  - ssm_a stored as A_log: canonical ssm_a = −exp(A_log) is negative by construction, so any
//    value ≥ 0 (in any layer) means the file holds A_log. An A_log whose values all happen to be
//    negative cannot be told from ssm_a — say it with --ssm-a.
//  - V heads in HF's grouped order: the values cannot tell (any order is a valid model). It is
//    known only when the file says so (our key `{arch}.gdn.v_head_order`) or the user does.
//
// A patched file records what was done in `clover.patch.applied` (array of strings, appended to
// when a file is patched twice): "expert_shared_count", "norm_plus_one", "ssm_a_from_a_log",
// "v_heads_tiled"; and says `{arch}.gdn.v_head_order = "tiled"` whenever the order is known.
// `clover.patch.pad` (spaces) sizes the header so tensor data keeps its offset within a page.
// Tensors that need no change are copied byte for byte (copy_file_range: in the kernel, no
// re-quantisation); the output goes through io::atomic_output (a fresh temporary file, fsync,
// rename), so a failure never leaves a broken OUT, and OUT may not be IN under any name.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clover/core/error.hpp"
#include "clover/io/atomic_file.hpp"
#include "clover/io/canonical_form.hpp"
#include "clover/io/gguf.hpp"
#include "clover/io/gguf_writer.hpp"
#include "clover/arch/registry.hpp"
#include "clover/quant/rows.hpp"

namespace clover {

struct variant_report {
    std::string arch;
    bool missing_shared_count = false;
    std::size_t n_norm_tensors = 0, n_norms_disagree = 0;
    double norm_median_mean = 1.0;  // median over norm tensors of each tensor's mean
    bool norms_zero_centred = false;
    bool norms_mixed = false;       // more than 10 % of the norm tensors on the other side: not decided
    std::size_t n_ssm_a_values = 0, n_ssm_a_nonneg = 0;
    bool ssm_a_is_a_log = false;
    std::optional<io::v_order> v_order_stated;  // from {arch}.gdn.v_head_order
    std::vector<std::string> patched_before;    // clover.patch.applied
    bool has_gdn = false;

    bool needs_patch() const {
        return missing_shared_count || norms_zero_centred || ssm_a_is_a_log || v_order_stated == io::v_order::grouped;
    }
    // Several lines for `gguf info`.
    std::string describe() const {
        std::string s;
        char b[256];
        if (!needs_patch()) s += "variant: canonical (no known vendor-file difference found)\n";
        else s += "variant: vendor file with known differences (clover gguf patch IN OUT makes it canonical):\n";
        if (missing_shared_count) s += "  - " + arch + ".expert_shared_count is missing (1 is implied)\n";
        if (n_norm_tensors) {
            std::snprintf(b, sizeof b, "  %s norm weights: median per-tensor mean %.3f over %zu tensors -> %s%s\n",
                          norms_zero_centred ? "-" : " ", norm_median_mean, n_norm_tensors,
                          norms_mixed ? "mixed, cannot tell (say it with --norms)"
                          : norms_zero_centred ? "zero-centred: the +1 was not folded" : "folded (+1 applied, canonical)",
                          n_norms_disagree && !norms_mixed ? " (a few tensors disagree)" : "");
            s += b;
        }
        if (n_ssm_a_values) {
            std::snprintf(b, sizeof b, "  %s ssm_a: %zu of %zu values >= 0 -> %s\n", ssm_a_is_a_log ? "-" : " ", n_ssm_a_nonneg,
                          n_ssm_a_values,
                          ssm_a_is_a_log ? "holds A_log (canonical ssm_a = -exp(A_log) is always negative)"
                                         : "negative, as canonical (an all-negative A_log would look the same: --ssm-a says it)");
            s += b;
        }
        if (has_gdn) {
            if (v_order_stated == io::v_order::grouped) s += "  - V heads: grouped (HF) order, as the file states (patch reorders them to tiled)\n";
            else if (v_order_stated == io::v_order::tiled) s += "    V heads: tiled (canonical), as the file states\n";
            else s += "    V heads: not stated by the file, and values cannot tell tiled from grouped: tiled (canonical) is assumed;\n"
                      "      if the converter skipped the reorder, patch with --v-heads grouped\n";
        }
        if (!patched_before.empty()) {
            s += "  patched before:";
            for (const auto& p : patched_before) s += " " + p;
            s += "\n";
        }
        return s;
    }
};

namespace variant_detail {

inline bool is_folded_norm_name(const std::string& n) {
    return n.ends_with("norm.weight") && !n.ends_with("ssm_norm.weight");
}
inline bool is_ssm_a_name(const std::string& n) { return n.starts_with("blk.") && n.ends_with(".ssm_a"); }

inline std::vector<float> values(const io::gguf_tensor& t, const std::string& path) {
    if (t.type != dtype::f32 && t.type != dtype::f16 && t.type != dtype::bf16)
        fail(path, ": tensor '", t.name, "' is stored as ", dtype_name(t.type), "; expected F32, F16 or BF16");
    std::vector<float> v(std::size_t(t.nelements()));
    quant::dequantize_row(t.type, t.data, v.data(), t.nelements());
    return v;
}
inline std::vector<std::byte> store(const io::gguf_tensor& t, const std::vector<float>& v) {
    std::vector<std::byte> b(t.nbytes);
    quant::quantize_row(t.type, v.data(), b.data(), t.nelements());
    return b;
}

// "blk.N.suffix" -> N and suffix; -1 otherwise.
inline std::int64_t split_block(const std::string& name, std::string* suffix) {
    if (!name.starts_with("blk.")) return -1;
    const std::size_t dot = name.find('.', 4);
    if (dot == std::string::npos || dot == 4) return -1;
    std::int64_t n = 0;
    for (std::size_t i = 4; i < dot; ++i) {
        if (name[i] < '0' || name[i] > '9' || n > 1000000) return -1;
        n = n * 10 + (name[i] - '0');
    }
    *suffix = name.substr(dot + 1);
    return n;
}

}  // namespace variant_detail

inline variant_report detect_variant(const io::gguf_file& f) {
    variant_report r;
    r.arch = f.get_string("general.architecture").value_or("");
    const std::string p = r.arch + ".";
    r.missing_shared_count = r.arch == "clover_moe" && !f.has(p + "expert_shared_count");
    std::vector<double> means;
    for (const auto& t : f.tensors()) {
        if (variant_detail::is_folded_norm_name(t.name)) {
            if (t.type != dtype::f32 && t.type != dtype::f16 && t.type != dtype::bf16) continue;
            const auto v = variant_detail::values(t, f.path());
            double s = 0;
            for (float x : v) s += x;
            means.push_back(s / double(v.size()));
        } else if (variant_detail::is_ssm_a_name(t.name)) {
            r.has_gdn = true;
            if (t.type != dtype::f32 && t.type != dtype::f16 && t.type != dtype::bf16) continue;
            for (float x : variant_detail::values(t, f.path())) {
                ++r.n_ssm_a_values;
                r.n_ssm_a_nonneg += x > 0.f || (x == 0.f && !std::signbit(x));  // −exp(very negative) is −0: canonical
            }
        }
    }
    r.n_norm_tensors = means.size();
    if (!means.empty()) {
        std::vector<double> m = means;
        std::nth_element(m.begin(), m.begin() + std::ptrdiff_t(m.size() / 2), m.end());
        r.norm_median_mean = m[m.size() / 2];
        const bool low = r.norm_median_mean < 0.5;
        for (double x : means) r.n_norms_disagree += (x < 0.5) != low;
        // Only a clear majority counts: a file whose norms split both ways is reported as mixed.
        r.norms_zero_centred = low && r.n_norms_disagree * 10 <= means.size();
        r.norms_mixed = r.n_norms_disagree * 10 > means.size();
    }
    r.ssm_a_is_a_log = r.n_ssm_a_nonneg > 0;
    if (auto o = f.get_string(p + "gdn.v_head_order")) {
        if (*o == "grouped") r.v_order_stated = io::v_order::grouped;
        else if (*o == "tiled") r.v_order_stated = io::v_order::tiled;
    }
    if (const io::gguf_value* a = f.find("clover.patch.applied"); a && a->type == io::gguf_type::array && a->elem == io::gguf_type::string)
        r.patched_before = a->strs;
    return r;
}

enum class v_heads_choice { from_file, tiled, grouped };

struct patch_options {
    std::optional<bool> norms_add_one{};     // nullopt: as detected
    std::optional<bool> ssm_a_from_a_log{};  // nullopt: as detected
    v_heads_choice v_heads = v_heads_choice::from_file;  // from_file: the file's key, else tiled
    void (*warn)(const std::string&) = nullptr;
    std::function<void(std::uint64_t, std::uint64_t)> progress = {};  // bytes done, bytes in all
};

// What will be changed.
struct patch_plan {
    bool shared_count = false, norms = false, ssm_a = false, v_heads = false;
    bool v_order_known = false;          // the order is stated (file or user): write the key
    std::vector<std::string> applied;    // for clover.patch.applied
    io::gdn_head_dims heads;
    std::vector<bool> recurrent;
};

inline patch_plan plan_patch(const io::gguf_file& f, const variant_report& r, const patch_options& o) {
    patch_plan p;
    p.shared_count = r.missing_shared_count;
    p.norms = o.norms_add_one.value_or(r.norms_zero_centred);
    p.ssm_a = o.ssm_a_from_a_log.value_or(r.ssm_a_is_a_log);
    if (o.v_heads == v_heads_choice::grouped) {
        p.v_heads = true;
        if (r.v_order_stated == io::v_order::tiled && o.warn)
            o.warn(f.path() + ": the file says its V heads are tiled; reordering them as grouped because --v-heads grouped says so");
    } else if (o.v_heads == v_heads_choice::from_file) {
        p.v_heads = r.v_order_stated == io::v_order::grouped;
    }
    p.v_order_known = r.v_order_stated.has_value() || o.v_heads != v_heads_choice::from_file;
    if (p.shared_count) p.applied.push_back("expert_shared_count");
    if (p.norms) p.applied.push_back("norm_plus_one");
    if (p.ssm_a) p.applied.push_back("ssm_a_from_a_log");
    if (p.v_heads) p.applied.push_back("v_heads_tiled");
    if (p.v_heads) {
        // The reorder needs the GDN dimensions and which layers are GDN. The key is read as
        // "tiled" here: this hparams is only for sizes.
        hparams h = read_hparams(f);
        p.heads = {h.gdn_qk_heads(), h.gdn_v_heads(), h.gdn_dk(), h.gdn_dv()};
        p.recurrent = h.recurrent;
    }
    return p;
}

// The V-head-indexed slice of t when plan p reorders it (GDN layers only), else none.
inline io::v_perm reorder_of(const io::gguf_tensor& t, const patch_plan& p) {
    if (!p.v_heads) return {};
    std::string suffix;
    const std::int64_t il = variant_detail::split_block(t.name, &suffix);
    if (il < 0 || il >= std::int64_t(p.recurrent.size()) || !p.recurrent[std::size_t(il)]) return {};
    return io::v_perm_of(suffix, p.heads);
}

inline bool value_change(const io::gguf_tensor& t, const patch_plan& p) {
    return (p.norms && variant_detail::is_folded_norm_name(t.name)) || (p.ssm_a && variant_detail::is_ssm_a_name(t.name));
}

// Whether tensor t changes under plan p; `reorder`: V heads are moved (on disk) rather than
// stated by key (in memory).
inline bool will_change(const io::gguf_tensor& t, const patch_plan& p, bool reorder) {
    return value_change(t, p) || (reorder && reorder_of(t, p));
}

// The new bytes of tensor t under plan p, or empty when t is unchanged.
inline std::vector<std::byte> patched_bytes(const io::gguf_file& f, const io::gguf_tensor& t, const patch_plan& p, bool reorder) {
    using namespace variant_detail;
    std::vector<std::byte> out;
    if (value_change(t, p)) {
        std::vector<float> v = values(t, f.path());
        const bool norm = is_folded_norm_name(t.name);
        for (float& x : v) x = norm ? io::canonical_norm(x) : io::canonical_ssm_a(x);
        out = store(t, v);
    }
    if (const io::v_perm pm = reorder ? reorder_of(t, p) : io::v_perm{}) {
        std::vector<std::byte> src = out.empty() ? std::vector<std::byte>(t.data, t.data + t.nbytes) : std::move(out);
        out.assign(t.nbytes, std::byte{0});
        io::v_permute_tensor(pm, t.type, t.ne.data(), src, out, io::v_order::tiled, p.heads, t.name);
    }
    return out;
}

namespace variant_detail {
inline void put_keys(io::gguf_writer& w, const io::gguf_file& f, const variant_report& r, const patch_plan& p, bool grouped_in_memory) {
    for (const auto& [k, v] : f.metadata()) w.set(k, v);
    const std::string pre = r.arch + ".";
    if (p.shared_count) w.set_u32(pre + "expert_shared_count", 1);
    if (grouped_in_memory) w.set_string(pre + "gdn.v_head_order", "grouped");
    else if (p.v_order_known && r.has_gdn) w.set_string(pre + "gdn.v_head_order", "tiled");
    std::vector<std::string> applied = r.patched_before;
    for (const auto& a : p.applied)
        if (std::find(applied.begin(), applied.end(), a) == applied.end()) applied.push_back(a);
    w.set_string_array("clover.patch.applied", applied);
}
}  // namespace variant_detail

// The file made canonical in memory: the same file when nothing needs doing, else a virtual
// file whose changed tensors are owned F32/F16/BF16 copies and whose V-head order, when
// grouped, is stated by key (the layers then pair heads the HF way; nothing is moved).
// `applied` (optional) receives what was done.
inline std::shared_ptr<const io::gguf_file> canonicalize(std::shared_ptr<const io::gguf_file> f, const patch_options& o = {},
                                                         std::vector<std::string>* applied = nullptr) {
    const variant_report r = detect_variant(*f);
    patch_plan p = plan_patch(*f, r, o);
    // In memory the V heads are not moved: a grouped file only needs the key that says so.
    const bool grouped = p.v_heads && r.v_order_stated != io::v_order::grouped;
    std::erase(p.applied, std::string("v_heads_tiled"));
    p.v_order_known = false;
    if (grouped) p.applied.push_back("v_heads_grouped_by_key");
    if (applied) *applied = p.applied;
    if (p.applied.empty()) return f;
    struct keep {
        std::shared_ptr<const io::gguf_file> base;
        std::deque<std::vector<std::byte>> owned;
    };
    auto k = std::make_shared<keep>();
    k->base = f;
    std::vector<io::gguf_tensor> ts = f->tensors();
    for (auto& t : ts) {
        auto b = patched_bytes(*f, t, p, false);
        if (b.empty()) continue;
        t.data = k->owned.emplace_back(std::move(b)).data();
    }
    io::gguf_writer w;
    variant_detail::put_keys(w, *f, r, p, grouped);
    return std::make_shared<const io::gguf_file>(f->path(), w.metadata(), std::move(ts), k);
}

inline std::shared_ptr<const io::gguf_file> load_canonical(const std::filesystem::path& path, const patch_options& o = {}) {
    std::vector<std::string> applied;
    auto f = canonicalize(std::make_shared<const io::gguf_file>(path), o, &applied);
    if (!applied.empty() && o.warn) {
        std::string list;
        for (const auto& a : applied) list += (list.empty() ? "" : ", ") + a;
        o.warn(path.string() + ": vendor-file variant, made canonical in memory (" + list +
               "); `clover gguf patch` writes a canonical copy");
    }
    return f;
}

struct patch_result {
    std::vector<std::string> applied;
    bool v_order_assumed = false;  // GDN file that does not state its V-head order, and no --v-heads: tiled assumed
    std::size_t n_changed = 0, n_copied = 0;
    std::uint64_t bytes = 0;  // size of OUT
    double seconds = 0;
};

namespace variant_detail {

struct fd_guard {
    int fd = -1;
    ~fd_guard() {
        if (fd >= 0) ::close(fd);
    }
};

inline void pwrite_all(int fd, const std::byte* p, std::size_t n, std::uint64_t off, const std::string& out) {
    while (n > 0) {
        const ssize_t w = ::pwrite(fd, p, n, off_t(off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail(out, ": write failed: ", std::strerror(errno ? errno : EIO));
        p += w;
        n -= std::size_t(w);
        off += std::uint64_t(w);
    }
}

// [in_off, in_off + n) of in → [out_off, ...) of out, in the kernel when it can.
inline void copy_range(int in, std::uint64_t in_off, int out, std::uint64_t out_off, std::uint64_t n, const std::string& in_path,
                       const std::string& out_path, std::vector<std::byte>& buf) {
    bool kernel = true;
    while (n > 0) {
        if (kernel) {
            loff_t a = loff_t(in_off), b = loff_t(out_off);
            const ssize_t c = ::copy_file_range(in, &a, out, &b, std::size_t(n), 0);
            if (c > 0) {
                in_off += std::uint64_t(c);
                out_off += std::uint64_t(c);
                n -= std::uint64_t(c);
                continue;
            }
            if (c < 0 && errno == EINTR) continue;
            if (c < 0 && errno != EXDEV && errno != ENOSYS && errno != EINVAL && errno != EOPNOTSUPP && errno != EBADF)
                fail(out_path, ": copy failed: ", std::strerror(errno));
            kernel = false;  // not supported here (or 0 = unexpected end): plain reads and writes
        }
        if (buf.empty()) buf.resize(std::size_t(16) << 20);
        const std::size_t want = std::size_t(std::min<std::uint64_t>(n, buf.size()));
        const ssize_t r = ::pread(in, buf.data(), want, off_t(in_off));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) fail(in_path, ": read failed", r == 0 ? " (file shorter than its header says)" : "");
        pwrite_all(out, buf.data(), std::size_t(r), out_off, out_path);
        in_off += std::uint64_t(r);
        out_off += std::uint64_t(r);
        n -= std::uint64_t(r);
    }
}

}  // namespace variant_detail

// Writes the canonical form of `in` to `out` (see the top of this header).
inline patch_result patch_file(const std::filesystem::path& in, const std::filesystem::path& out, const patch_options& o = {}) {
    using namespace variant_detail;
    const auto t0 = std::chrono::steady_clock::now();
    const io::gguf_file f(in);
    // Refused here, before any work, when OUT is IN under any name (io/atomic_file.hpp).
    io::atomic_output dst(out, {f.map().identity()});
    const variant_report r = detect_variant(f);
    const patch_plan p = plan_patch(f, r, o);
    patch_result res;
    res.applied = p.applied;
    res.v_order_assumed = r.has_gdn && !r.v_order_stated && o.v_heads == v_heads_choice::from_file;

    io::gguf_writer w(f.alignment());
    put_keys(w, f, r, p, false);
    std::vector<bool> changed(f.tensors().size());
    for (std::size_t i = 0; i < f.tensors().size(); ++i) {
        const io::gguf_tensor& t = f.tensors()[i];
        std::vector<std::int64_t> ne(t.ne.begin(), t.ne.begin() + t.n_dims);
        w.add_tensor(t.name, t.type, ne, [](std::span<std::byte>) {});  // bytes are placed below
        changed[i] = will_change(t, p, true);
    }
    // Keep the data section's offset within a page: the kernel then copies whole pages (a
    // copy shifted by 32 bytes runs ~20 % slower). The header grows by a padding key to match.
    const std::string pad_key = "clover.patch.pad";
    w.set_string(pad_key, "");
    const std::size_t page = 4096, unpadded = w.header(false).size();
    if (page % f.alignment() == 0 && f.data_offset() % f.alignment() == 0) {
        const std::size_t want = f.data_offset() % page;
        const std::size_t target = unpadded + (want + page - unpadded % page) % page;
        w.set_string(pad_key, std::string(target - unpadded, ' '));
    }
    const std::vector<std::byte> head = w.header();
    const std::uint64_t total = head.size() + w.data_size();

    const std::string out_s = out.string();
    // The bytes are copied from a second descriptor: it must be the file that was parsed.
    struct stat src_st{};
    fd_guard src{io::open_regular(f.path(), &src_st)};
    if (src_st.st_dev != f.map().identity().dev || src_st.st_ino != f.map().identity().ino)
        fail(f.path(), ": the file was replaced while it was being read");
    ::posix_fadvise(src.fd, 0, 0, POSIX_FADV_SEQUENTIAL);  // a larger readahead window, as cp asks for
    pwrite_all(dst.fd(), head.data(), head.size(), 0, out_s);
    std::vector<std::byte> buf;
    const auto& ts = f.tensors();
    const auto& os = w.tensors();
    std::uint64_t done = head.size();
    // 1. Runs of tensors laid out alike in both files, each one in-kernel copy. Small
    //    tensors to be rewritten stay inside a run (overwritten below), so a file whose
    //    layout is unchanged is copied in one call, like cp does; big rewritten ones (V-head
    //    reorder of the projections) split runs, so their bytes are not written twice.
    auto skip = [&](std::size_t k) { return changed[k] && ts[k].nbytes >= (std::size_t(1) << 20); };
    for (std::size_t i = 0; i < ts.size();) {
        if (skip(i)) { ++i; continue; }
        std::size_t j = i + 1;
        while (j < ts.size() && !skip(j) && ts[j].offset >= ts[i].offset && ts[j].offset - ts[i].offset == os[j].offset - os[i].offset)
            ++j;
        const std::uint64_t n = os[j - 1].offset + ts[j - 1].nbytes - os[i].offset;
        copy_range(src.fd, f.data_offset() + ts[i].offset, dst.fd(), head.size() + os[i].offset, n, f.path(), out_s, buf);
        done += n;
        if (o.progress) o.progress(done, total);
        i = j;
    }
    // 2. The rewritten tensors, one at a time (bounded memory).
    for (std::size_t i = 0; i < ts.size(); ++i) {
        if (!changed[i]) {
            ++res.n_copied;
            continue;
        }
        f.map().advise_willneed(f.data_offset() + ts[i].offset, ts[i].nbytes);
        const std::vector<std::byte> b = patched_bytes(f, ts[i], p, true);
        pwrite_all(dst.fd(), b.data(), b.size(), head.size() + os[i].offset, out_s);
        ++res.n_changed;
    }
    if (o.progress) o.progress(total, total);
    dst.resize(total);
    dst.commit();
    res.bytes = total;
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return res;
}

}  // namespace clover
