#pragma once
// The backend conformance harness (in the spirit of llama.cpp's test-backend-ops): every
// primitive of the backend concept (backend/concept.hpp) run over one table of
// segment mixes × weight types × odd shapes, written once over the concept. The table's rows
// (conformance_table.hpp) say which primitives a case calls; this file builds the batches, the
// state each row needs, the inputs and weights, runs a case on a backend and compares runs:
//   check_self  — one backend against itself: the batch in fast mode against exact mode, each
//                 segment alone against the batch in exact mode (bit for bit, the row-exactness
//                 promise; verify segments in fast mode too), and against a scalar reference
//                 where the row has one;
//   check_peer  — a backend against a reference backend (CUDA against the CPU): both modes within
//                 the tolerance of each output's kind and weight type (tolerance()), and the
//                 subject's own row-exactness as above.
// A backend brings an io<B> (host <-> tensor, route and state reads); nothing else here knows it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <list>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <clover/backend/concept.hpp>
#include <clover/core/batch.hpp>
#include <clover/core/dtype.hpp>
#include <clover/quant/rows.hpp>

#include "../common/test_util.hpp"

namespace conformance {

using namespace clover;
using clover::backend::buf;

// ---- the table's dimensions --------------------------------------------------------------

// One segment of a mix: its kind, rows, the rows its sequence committed before (a setup pass),
// how many of its last rows give logits, and a preview's expert coreset (0: none).
struct seg_spec {
    pass_kind kind;
    std::int64_t n, history, logits, coreset;
};
struct mix {
    const char* name;
    std::vector<seg_spec> segs;
};

// The segment mixes every row runs over (small: fibers run them on the emulated device).
inline const std::vector<mix>& mixes() {
    using k = pass_kind;
    static const std::vector<mix> m = {
        {"prefill chunk", {{k::commit, 37, 9, 1, 0}}},  // more than one GDN chunk, after an earlier chunk
        {"decode rows", {{k::commit, 1, 5, 1, 0}, {k::commit, 1, 12, 1, 0}, {k::commit, 1, 1, 1, 0}}},
        {"verify rows", {{k::verify, 5, 7, 5, 0}}},
        {"preview 32", {{k::preview, 32, 6, 32, 0}}},
        {"preview 32 + coreset", {{k::preview, 32, 11, 32, 3}}},  // coreset 3 < k: padded route slots
        {"several sequences",
         {{k::commit, 6, 3, 2, 0}, {k::commit, 1, 9, 1, 0}, {k::verify, 4, 5, 4, 0}, {k::preview, 8, 4, 8, 5},
          {k::preview, 5, 2, 0, 0}, {k::commit, 3, 0, 0, 0}}},
    };
    return m;
}

inline const std::vector<dtype>& weight_types() {
    static const std::vector<dtype> t = {dtype::f32, dtype::f16, dtype::bf16, dtype::q8_0, dtype::q4_k, dtype::q5_k, dtype::q6_k};
    return t;
}

// Odd shapes. Widths that a weight type's rows must divide come per class of type: float types
// (any width), Q8_0 (blocks of 32), K-quants (blocks of 256).
struct shape {
    const char* name;
    std::int64_t width[3];   // model width E (the products' input)
    std::int64_t ff[3];      // expert width F (down's input)
    std::int64_t ff_sh[3];   // shared expert width
    std::int64_t out1, out2, vocab;
    std::int64_t H, Hkv, hd, n_rot;
    int sections[4];
    std::int64_t Hk, Hv, dk, dv, conv;
    bool grouped;
    std::int64_t X, k;
};
inline const std::vector<shape>& shapes() {
    static const std::vector<shape> s = {
        {"A", {77, 160, 256}, {29, 96, 256}, {45, 64, 256}, 37, 19, 45, 6, 2, 40, 24, {4, 4, 3, 0}, 2, 6, 16, 12, 4, true, 13, 4},
        {"B", {45, 96, 512}, {53, 32, 256}, {19, 128, 512}, 17, 5, 29, 4, 1, 24, 8, {1, 1, 0, 1}, 3, 3, 9, 11, 3, false, 7, 3},
    };
    return s;
}

inline int type_class(dtype t) {
    if (t == dtype::q8_0) return 1;
    if (t == dtype::q4_k || t == dtype::q5_k || t == dtype::q6_k) return 2;
    return 0;
}

struct case_ {
    const shape* sh;
    const mix* mx;
    dtype type;
    std::int64_t E() const { return sh->width[type_class(type)]; }
    std::int64_t F() const { return sh->ff[type_class(type)]; }
    std::int64_t Fs() const { return sh->ff_sh[type_class(type)]; }
    std::int64_t C() const { return 2 * sh->Hk * sh->dk + sh->Hv * sh->dv; }
    backend::attention_shape attention() const {
        return {sh->H,   sh->Hkv, sh->hd, sh->n_rot, 5000.f, 1e-6f, 1.f / std::sqrt(float(sh->hd)),
                {sh->sections[0], sh->sections[1], sh->sections[2], sh->sections[3]}};
    }
    backend::gdn_shape gdn() const { return {sh->Hk, sh->Hv, sh->dk, sh->dv, sh->conv, C(), 1e-6f, sh->grouped}; }
    backend::moe_shape moe(bool shared) const { return {sh->X, sh->k, F(), shared ? Fs() : 0}; }
    std::string describe() const { return std::string(dtype_name(type)) + ", " + mx->name + ", shape " + sh->name; }
};

// ---- outputs and their tolerances ----------------------------------------------------------

// What an output is, which decides how closely two backends (or two modes) must agree:
enum class kind {
    exact,      // copies and exact arithmetic (h += y, a split, route ids): bit for bit everywhere
    dequant,    // dequantized rows
    math,       // f32 arithmetic of one primitive (norms, rope, conv, attention, softmax)
    product,    // one product over the weight type (activations rounded to its partner type)
    chain,      // products whose intermediate is rounded to an activation type again (MoE)
    recurrent,  // GDN outputs and states (chunked WY form against the recurrence)
    page,       // KV rows as stored in the pages (F16 or F32: the case's type)
    routing,    // route weights: top-k probabilities renormalised
};
inline const char* kind_name(kind k) {
    constexpr const char* n[] = {"exact", "dequant", "math", "product", "chain", "recurrent", "page", "routing"};
    return n[int(k)];
}
enum class cmp { peer, modes, scalar };  // backend vs backend; fast vs exact mode; vs a scalar reference

// max |a - b| / (1 + max |b|) over one output of one segment. Tolerances, and why:
// - exact: bit for bit.
// - dequant: the same formula on both sides, but the host compiler may contract the CPU's
//   d·sc·q − dmin·m into an fma (GCC's -ffp-contract=fast) where the device spells out two
//   roundings: Q4_K and Q5_K then differ by an ulp (1e-6); every other type bit for bit.
// - math: f32 arithmetic in another order (tree reductions against sequential loops; the
//   device's expf against libm's): a few ulps of the largest value, 1e-5.
// - product: activation conversion is bit-identical on both backends (a test of its own), the
//   integer block dots are exact, so only the f32 summation order over blocks (and F32/F16/BF16
//   elements) differs: K * eps relative at most, 1e-5 for these widths (<= 512).
// - chain: as product for F32; with a rounded activation type the SwiGLU output of one backend
//   can sit on the other side of a rounding boundary of its F16/BF16 element or Q8_0/Q8_K code,
//   one quantization step (1/127 of a block's largest value for Q8_*, 2^-8 for BF16) on one
//   element of the down product: 2e-3 (F16, whose step is 2^-11: 5e-4).
// - recurrent: the chunked (WY) form against the recurrence, and the device's scan against the
//   CPU's, over up to 46 rows of state: f32 sums in another order carried through the state,
//   1e-5 (the layer tests bound WY against the recurrence at 2e-5 over 130 rows).
// - page: F32 pages as math; F16 pages round k and v (normed, roped: math apart) to F16, where one
//   ulp of difference before rounding can flip the F16 rounding: 2^-11 relative, 2e-3.
// - routing: a softmax over a handful of logits (the device's expf against libm's) and a
//   renormalisation of the top k: an ulp or two, 1e-6 (the routing kernel's own test's bound).
inline float tolerance(kind k, dtype t, cmp c) {
    const bool rounded_act = t != dtype::f32;
    switch (k) {
        case kind::exact: return 0.f;
        case kind::dequant: return c != cmp::modes && (t == dtype::q4_k || t == dtype::q5_k) ? 1e-6f : 0.f;
        case kind::math: return 1e-5f;
        case kind::product: return 1e-5f;
        case kind::chain: return !rounded_act ? 1e-5f : t == dtype::f16 ? 5e-4f : 2e-3f;
        case kind::recurrent: return 1e-5f;
        case kind::page: return t == dtype::f16 ? 2e-3f : 1e-5f;
        case kind::routing: return 1e-6f;
    }
    return 0.f;
}

struct output {
    kind k = kind::exact;
    std::map<int, std::vector<float>> by_seg;  // the mix's segment index -> its values
};
using outputs = std::map<std::string, output>;

// ---- what an operation sees ----------------------------------------------------------------

// Host weights of one case: built once, shared by every run of the case (each backend's own copy,
// a device upload, is keyed by the address: the store outlives the backends).
struct weight_store {
    struct stored {
        std::vector<std::byte> bytes;
        weight w;
    };
    std::map<std::string, stored> w;
};

inline std::uint64_t mix_seed(std::string_view name, std::uint64_t a, std::uint64_t b) {
    std::uint64_t h = 1469598103934665603ull;
    for (char ch : name) h = (h ^ std::uint8_t(ch)) * 1099511628211ull;
    h = (h ^ a) * 1099511628211ull;
    return (h ^ (b + 0x9e3779b97f4a7c15ull)) * 1099511628211ull;
}

// The backend-independent part of a run: the batch, its inputs (a function of the input's name,
// the segment and the position, so a segment alone gets the rows it gets in the batch), the
// weights and the outputs. Scalar references see only this.
struct env_base {
    const case_& c;
    weight_store& ws;
    batch bt;
    std::vector<int> seg_of;  // batch segment -> the mix's segment index
    bool recording = false;   // the pass under test (not a setup pass)
    outputs out;

    env_base(const case_& cs, weight_store& w) : c(cs), ws(w) {}
    std::int64_t n() const { return bt.rows(); }

    std::vector<float> rows(std::string_view name, std::int64_t cols, float lo = -1.f, float hi = 1.f) const {
        std::vector<float> v(std::size_t(n() * cols));
        for (std::size_t s = 0; s < bt.segments().size(); ++s) {
            const segment& sg = bt.segments()[s];
            for (std::int64_t r = 0; r < sg.n; ++r) {
                const auto row = testutil::random_vec(std::size_t(cols), mix_seed(name, std::uint64_t(seg_of[s]), std::uint64_t(sg.pos0 + r)), lo, hi);
                std::copy(row.begin(), row.end(), v.begin() + (sg.row0 + r) * cols);
            }
        }
        return v;
    }
    // A weight of `rows` x `cols` (n_mat stacked matrices) of type t, values in [lo, hi).
    const weight& weight_of(const std::string& name, dtype t, std::int64_t rows, std::int64_t cols, std::int64_t n_mat = 1,
                            float lo = -1.f, float hi = 1.f) {
        auto it = ws.w.find(name);
        if (it != ws.w.end()) return it->second.w;
        auto& s = ws.w[name];
        const std::size_t rb = quant::row_bytes(t, cols);
        s.bytes.resize(rb * std::size_t(n_mat * rows));
        const auto f = testutil::random_vec(std::size_t(n_mat * rows * cols), mix_seed(name, std::uint64_t(t), 7), lo, hi);
        for (std::int64_t r = 0; r < n_mat * rows; ++r) quant::quantize_row(t, f.data() + r * cols, s.bytes.data() + std::size_t(r) * rb, cols);
        s.w.data = s.bytes.data();
        s.w.type = t;
        s.w.cols = cols;
        s.w.rows = rows;
        s.w.n_mat = n_mat;
        s.w.row_bytes = rb;
        s.w.name = name;
        return s.w;
    }
    const weight& vec_weight(const std::string& name, std::int64_t n, float lo = 0.5f, float hi = 1.5f, std::int64_t rows = 1) {
        return weight_of(name, dtype::f32, rows, n / rows, 1, lo, hi);
    }

    // Host rows [n, cols] of the pass, split by segment; logits rows [n_logits, cols] likewise.
    void save_rows(const std::string& name, kind k, const std::vector<float>& v, std::int64_t cols) {
        if (!recording) return;
        output& o = out[name];
        o.k = k;
        o.by_seg.clear();
        for (std::size_t s = 0; s < bt.segments().size(); ++s) {  // rows run apart: in order, per segment
            const segment& sg = bt.segments()[s];
            auto& d = o.by_seg[seg_of[s]];
            d.insert(d.end(), v.begin() + sg.row0 * cols, v.begin() + (sg.row0 + sg.n) * cols);
        }
    }
    void save_logits(const std::string& name, kind k, const std::vector<float>& v, std::int64_t cols) {
        if (!recording) return;
        output& o = out[name];
        o.k = k;
        o.by_seg.clear();
        for (std::size_t s = 0; s < bt.segments().size(); ++s) {
            const segment& sg = bt.segments()[s];
            auto& d = o.by_seg[seg_of[s]];
            d.insert(d.end(), v.begin() + sg.out_row0 * cols, v.begin() + (sg.out_row0 + sg.n_logits()) * cols);
        }
    }
    void save_seq(const std::string& name, kind k, int seg, std::vector<float> v) {
        output& o = out[name];
        o.k = k;
        o.by_seg[seg] = std::move(v);
    }
};

// What a backend's test brings: host vectors into and out of its tensors, routes and state.
//   static void put(B&, typename B::tensor, const std::vector<float>&);
//   static std::vector<float> get(B&, typename B::context&, typename B::tensor);   // after the pass's queued work
//   static void put_route(B&, typename B::route, const std::vector<std::int32_t>&, const std::vector<float>&);
//   static void get_route(B&, typename B::context&, typename B::route, std::vector<std::int32_t>&, std::vector<float>&);
//   static void read(typename B::state&, void* host, const void* backend_memory, std::size_t bytes);
template <class B>
struct io;

// What the state a row needs holds: layer 0 of the other kind (so slots are not layer indices),
// the tested layer at index 1. gdn_conv: a GDN layer whose rows never reach gdn_mix (no verify
// record to replay: its rollback only truncates).
enum class needs { nothing, attention, gdn_conv, gdn };
inline constexpr std::int64_t tested_layer = 1;

template <class B>
struct env : env_base {
    using T = typename B::tensor;
    B& be;
    typename B::context& cx;
    typename B::state* st;

    env(const case_& cs, weight_store& w, B& b, typename B::context& x, typename B::state* s) : env_base(cs, w), be(b), cx(x), st(s) {}

    // Input rows of the pass in the pass buffer `b`.
    T in(buf b, std::string_view name, std::int64_t cols, float lo = -1.f, float hi = 1.f) {
        T t = cx.get(b, n(), cols);
        io<B>::put(be, t, rows(name, cols, lo, hi));
        return t;
    }
    T scratch(buf b, std::int64_t cols) { return cx.get(b, n(), cols); }
    void save(const std::string& name, kind k, T t) {
        if (recording) save_rows(name, k, io<B>::get(be, cx, t), t.cols);
    }
    // A route of k distinct experts of X per row, weights summing to 1 (a function of segment and
    // position, as inputs are).
    typename B::route route_in(std::int64_t X, std::int64_t k) {
        std::vector<std::int32_t> ids(std::size_t(n() * k));
        std::vector<float> w(ids.size());
        for (std::size_t s = 0; s < bt.segments().size(); ++s) {
            const segment& sg = bt.segments()[s];
            for (std::int64_t r = 0; r < sg.n; ++r) {
                rng g(mix_seed("route", std::uint64_t(seg_of[s]), std::uint64_t(sg.pos0 + r)));
                std::vector<std::int32_t> all(static_cast<std::size_t>(X));
                for (std::int64_t e = 0; e < X; ++e) all[std::size_t(e)] = std::int32_t(e);
                for (std::int64_t j = 0; j < k; ++j) std::swap(all[std::size_t(j)], all[std::size_t(j + std::int64_t(g.next() % std::uint64_t(X - j)))]);
                float sum = 0;
                for (std::int64_t j = 0; j < k; ++j) sum += w[std::size_t((sg.row0 + r) * k + j)] = g.uniform(0.1f, 1.f);
                for (std::int64_t j = 0; j < k; ++j) {
                    ids[std::size_t((sg.row0 + r) * k + j)] = all[std::size_t(j)];
                    w[std::size_t((sg.row0 + r) * k + j)] /= sum;
                }
            }
        }
        typename B::route rt = cx.get_route(n(), k);
        io<B>::put_route(be, rt, ids, w);
        return rt;
    }
    void save_route(typename B::route r) {
        if (!recording) return;
        std::vector<std::int32_t> ids;
        std::vector<float> w;
        io<B>::get_route(be, cx, r, ids, w);
        save_rows("route ids", kind::exact, std::vector<float>(ids.begin(), ids.end()), r.k);
        save_rows("route weights", kind::routing, w, r.k);
    }
};

// A row of the table: one primitive (or a short chain of them, for inputs only a primitive makes),
// the weight types (or KV page types) it runs over, the state it needs, a scalar reference of its
// outputs over env_base where one exists, and whether its rows are independent of each other
// (stateless and no block-wide choice such as a coreset): then each row run as a one-row segment
// must give the batch's bits in exact mode.
template <class B>
struct row {
    const char* name;
    std::vector<dtype> types;
    needs state;
    void (*op)(env<B>&);
    void (*scalar)(env_base&) = nullptr;
    bool rowwise = true;
};

// ---- running a case ------------------------------------------------------------------------

struct run_opts {
    bool exact = false;
    int only = -1;             // the mix's segment to run alone (-1: all of them)
    bool split_rows = false;   // every row its own one-row segment (stateless rows only)
};

inline std::vector<token> tokens_of(const case_& c, int seg, std::int64_t pos0, std::int64_t n) {
    std::vector<token> t(static_cast<std::size_t>(n));
    for (std::int64_t r = 0; r < n; ++r) t[std::size_t(r)] = token(mix_seed("token", std::uint64_t(seg), std::uint64_t(pos0 + r)) % std::uint64_t(c.sh->vocab));
    return t;
}

// KV rows [0, n_past) of the tested layer, or its GDN state and conv ring, per sequence, as f32.
template <class B>
void save_state(env<B>& e, const std::vector<seq_id>& seqs, needs nd, const std::string& when) {
    auto& st = *e.st;
    for (std::size_t i = 0; i < seqs.size(); ++i) {
        if (seqs[i] < 0) continue;
        e.save_seq("n_past" + when, kind::exact, int(i), {float(st.n_past(seqs[i]))});
        if (nd == needs::attention) {
            const std::int64_t w = st.kv_width(tested_layer);
            const bool f16 = st.kv_f16();
            for (int which = 0; which < 2; ++which) {
                std::vector<float> v;
                std::vector<std::byte> rowb(std::size_t(w) * (f16 ? 2 : 4));
                std::vector<float> f(static_cast<std::size_t>(w));
                for (std::int64_t p = 0; p < st.n_past(seqs[i]); ++p) {
                    io<B>::read(st, rowb.data(), st.kv(tested_layer, seqs[i], p, which), rowb.size());
                    quant::dequantize_row(f16 ? dtype::f16 : dtype::f32, rowb.data(), f.data(), w);
                    v.insert(v.end(), f.begin(), f.end());
                }
                e.save_seq(std::string(which ? "V" : "K") + " pages" + when, kind::page, int(i), std::move(v));
            }
        } else {
            auto& slot = st.gdn(tested_layer, seqs[i]);
            std::vector<float> S(slot.S.size()), ring(slot.ring.size());
            io<B>::read(st, S.data(), slot.S.data(), S.size() * 4);
            io<B>::read(st, ring.data(), slot.ring.data(), ring.size() * 4);
            e.save_seq("GDN state" + when, kind::recurrent, int(i), std::move(S));
            e.save_seq("conv ring" + when, kind::exact, int(i), std::move(ring));
        }
    }
}

// One run of a row over a case on backend `be`: a setup pass commits each sequence's history
// (rows that need state), then the pass under test, its state, and (verify segments) the state
// after keeping 2 of the verified rows.
template <class B>
outputs run(B& be, const row<B>& rw, const case_& c, weight_store& ws, run_opts o) {
    std::optional<typename B::state> st;
    std::vector<seq_id> seqs(c.mx->segs.size(), -1);
    const auto sh = *c.sh;
    if (rw.state != needs::nothing) {
        backend::layer_state_spec att{backend::layer_state_spec::kind::attention, sh.Hkv * sh.hd, 0, 0, 0, 0, 0};
        att.n_head = sh.H;
        att.head_dim = sh.hd;
        const backend::layer_state_spec gdn{backend::layer_state_spec::kind::gdn, 0, sh.Hv, sh.dk, sh.dv, sh.conv - 1, c.C()};
        const std::vector<backend::layer_state_spec> spec =
            rw.state == needs::attention ? std::vector{gdn, att} : std::vector{att, gdn};
        backend::state_options so;
        so.kv_f16 = c.type == dtype::f16;
        so.page = 4;  // page tables of several pages
        st.emplace(be.make_state(spec, so));
        for (std::size_t i = 0; i < seqs.size(); ++i) {
            const seg_spec& s = c.mx->segs[i];
            if (o.only < 0 || o.only == int(i)) seqs[i] = st->open(s.history + s.n + 1);
        }
    }
    auto* stp = st ? &*st : nullptr;
    if (st) {  // the setup pass: every history committed, in the mode of the run
        auto cx = be.begin_pass();
        env<B> e(c, ws, be, cx, stp);
        e.bt.exact = o.exact;
        for (std::size_t i = 0; i < seqs.size(); ++i) {
            const seg_spec& s = c.mx->segs[i];
            if (seqs[i] < 0 || s.history == 0) continue;
            e.bt.add(seqs[i], pass_kind::commit, tokens_of(c, int(i), 0, s.history), 0);
            e.seg_of.push_back(int(i));
        }
        if (!e.bt.empty()) {
            rw.op(e);
            st->advance(e.bt);
        }
    }
    auto cx = be.begin_pass();
    env<B> e(c, ws, be, cx, stp);
    e.bt.exact = o.exact;
    e.recording = true;
    seq_id next = 0;
    for (std::size_t i = 0; i < c.mx->segs.size(); ++i) {
        if (o.only >= 0 && o.only != int(i)) continue;
        const seg_spec& s = c.mx->segs[i];
        if (o.split_rows) {
            for (std::int64_t r = 0; r < s.n; ++r) {
                e.bt.add(next++, s.kind, tokens_of(c, int(i), s.history + r, 1), s.history + r, r >= s.n - s.logits ? 1 : 0, s.coreset);
                e.seg_of.push_back(int(i));
            }
            continue;
        }
        e.bt.add(st ? seqs[i] : next++, s.kind, tokens_of(c, int(i), s.history, s.n), s.history, s.logits, s.coreset);
        e.seg_of.push_back(int(i));
    }
    rw.op(e);
    if (st) {
        st->advance(e.bt);
        save_state(e, seqs, rw.state, "");
        bool rolled = false;
        for (std::size_t i = 0; i < seqs.size(); ++i)
            if (seqs[i] >= 0 && c.mx->segs[i].kind == pass_kind::verify) {
                // Only a row that ran the whole delta rule recorded what a replay reads (the conv
                // row alone records no scan inputs): the others roll back their KV rows only.
                st->rollback(seqs[i], 2, [&](auto& slot, std::int64_t keep) {
                    if (rw.state == needs::gdn) be.replay_gdn(slot, keep, c.gdn());
                });
                rolled = true;
            }
        if (rolled && rw.state != needs::gdn_conv) save_state(e, seqs, rw.state, " after rollback");
    }
    return std::move(e.out);
}

// The scalar reference's outputs for the case (all segments, one pass; stateless rows only).
template <class B>
outputs run_scalar(const row<B>& rw, const case_& c, weight_store& ws) {
    env_base e(c, ws);
    e.recording = true;
    for (std::size_t i = 0; i < c.mx->segs.size(); ++i) {
        const seg_spec& s = c.mx->segs[i];
        e.bt.add(seq_id(i), s.kind, tokens_of(c, int(i), s.history, s.n), s.history, s.logits, s.coreset);
        e.seg_of.push_back(int(i));
    }
    rw.scalar(e);
    return std::move(e.out);
}

// ---- comparing runs ------------------------------------------------------------------------

// Bit-for-bit equality. An empty output (a segment with no rows) has a null data(), and memcmp on
// a null pointer is undefined even for 0 bytes (UBSan stops there).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}
inline float rel_error(const std::vector<float>& a, const std::vector<float>& b) {
    float m = 0, d = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        m = std::max(m, std::fabs(b[i]));
        d = std::max(d, std::fabs(a[i] - b[i]));
        if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    }
    return d / (1.f + m);
}

// Every output of `want` is in `got`, within its kind's tolerance (bit for bit at 0).
// CLOVER_CONFORMANCE_ERRORS=1 prints each comparison's error (how the tolerances were chosen).
inline void compare(const outputs& got, const outputs& want, dtype t, cmp how, const std::string& what) {
    static const bool print = std::getenv("CLOVER_CONFORMANCE_ERRORS") != nullptr;
    for (const auto& [name, w] : want) {
        CAPTURE(name);
        const auto it = got.find(name);
        REQUIRE_MESSAGE(it != got.end(), what, ": no output '", name, "'");
        const float tol = tolerance(w.k, t, how);
        for (const auto& [seg, wv] : w.by_seg) {
            CAPTURE(seg);
            const auto g = it->second.by_seg.find(seg);
            REQUIRE(g != it->second.by_seg.end());
            REQUIRE(g->second.size() == wv.size());
            if (tol == 0.f) {
                CHECK_MESSAGE(same_bits(g->second, wv), what, ": ", kind_name(w.k),
                              " output differs (error ", rel_error(g->second, wv), ")");
                continue;
            }
            const float err = rel_error(g->second, wv);
            if (print) std::fprintf(stderr, "conformance error %-9s %-8s %-5s %.3g  %s / %s\n", kind_name(w.k), std::string(dtype_name(t)).c_str(),
                                    how == cmp::peer ? "peer" : how == cmp::modes ? "modes" : "ref", double(err), what.c_str(), name.c_str());
            CHECK_MESSAGE(err <= tol, what, ": ", kind_name(w.k), " error ", err, " > ", tol);
        }
    }
}
// The outputs of segment `seg` run alone equal its outputs in the batch, bit for bit.
inline void compare_alone(const outputs& alone, const outputs& batched, int seg, const std::string& what) {
    for (const auto& [name, a] : alone) {
        CAPTURE(name);
        const auto it = batched.find(name);
        REQUIRE(it != batched.end());
        const auto& av = a.by_seg.at(seg);
        const auto& bv = it->second.by_seg.at(seg);
        REQUIRE(av.size() == bv.size());
        CHECK_MESSAGE(same_bits(av, bv), what, ": segment ", seg,
                      " alone differs from the batch (error ", rel_error(av, bv), ")");
    }
}

// Rows to run: all, or those whose name contains CLOVER_CONFORMANCE_ROW.
template <class B>
bool selected(const row<B>& r) {
    const char* f = std::getenv("CLOVER_CONFORMANCE_ROW");
    return !f || std::string(r.name).find(f) != std::string::npos;
}

// Each case of the table: fn(case, row). A case that throws fails with its description.
template <class B, class F>
void for_each_case(const std::vector<row<B>>& table, F&& fn) {
    for (const row<B>& r : table) {
        if (!selected(r)) continue;
        for (const shape& sh : shapes())
            for (const mix& mx : mixes())
                for (dtype t : r.types) {
                    const case_ c{&sh, &mx, t};
                    const std::string what = std::string(r.name) + " (" + c.describe() + ")";
                    INFO(what);
                    try {
                        fn(c, r, what);
                    } catch (const std::exception& ex) {
                        FAIL_CHECK(what, " threw: ", ex.what());
                    }
                }
    }
}

// Row-exactness of one backend: each segment alone equals the batch, bit for bit, in exact mode;
// verify segments (always row-exact) in fast mode too.
template <class B, class Make>
void check_alone(const row<B>& r, const case_& c, weight_store& ws, Make& make, const outputs& exact, const outputs& fast,
                 const std::string& what) {
    if (r.rowwise && r.state == needs::nothing) {
        auto be = make();
        const outputs split = run(*be, r, c, ws, {.exact = true, .split_rows = true});
        for (std::size_t i = 0; i < c.mx->segs.size(); ++i) compare_alone(split, exact, int(i), what + ", each row alone, exact mode");
    }
    if (c.mx->segs.size() < 2) return;
    for (std::size_t i = 0; i < c.mx->segs.size(); ++i) {
        auto be = make();
        compare_alone(run(*be, r, c, ws, {.exact = true, .only = int(i)}), exact, int(i), what + ", exact mode");
        if (c.mx->segs[i].kind == pass_kind::verify)
            compare_alone(run(*be, r, c, ws, {.exact = false, .only = int(i)}), fast, int(i), what + ", verify rows, fast mode");
    }
}

// One backend against itself (fast vs exact, alone vs batched) and against the scalar references.
// make(): a fresh backend (std::unique_ptr<B>); each case gets its own, so device weight caches
// keyed by address never outlive the case's weights.
template <class B, class Make>
void check_self(const std::vector<row<B>>& table, Make make) {
    for_each_case(table, [&](const case_& c, const row<B>& r, const std::string& what) {
        weight_store ws;
        auto be = make();
        const outputs fast = run(*be, r, c, ws, {.exact = false});
        const outputs exact = run(*be, r, c, ws, {.exact = true});
        compare(fast, exact, c.type, cmp::modes, what + ": fast against exact mode");
        check_alone(r, c, ws, make, exact, fast, what);
        if (r.scalar) {
            const outputs ref = run_scalar(r, c, ws);
            compare(exact, ref, c.type, cmp::scalar, what + ": exact mode against the scalar reference");
            compare(fast, ref, c.type, cmp::scalar, what + ": fast mode against the scalar reference");
        }
    });
}

// Backend S against reference backend R, row by row of the same table (instantiated for each),
// in both modes; S's own row-exactness.
template <class S, class R, class MakeS, class MakeR>
void check_peer(const std::vector<row<S>>& table, const std::vector<row<R>>& ref_table, MakeS make_s, MakeR make_r) {
    REQUIRE(table.size() == ref_table.size());
    for_each_case(table, [&](const case_& c, const row<S>& r, const std::string& what) {
        const auto& rr = ref_table[std::size_t(&r - table.data())];
        weight_store ws;
        outputs want_fast, want_exact;
        {
            auto rb = make_r();
            want_fast = run(*rb, rr, c, ws, {.exact = false});
            want_exact = run(*rb, rr, c, ws, {.exact = true});
        }
        auto sb = make_s();
        const outputs fast = run(*sb, r, c, ws, {.exact = false});
        const outputs exact = run(*sb, r, c, ws, {.exact = true});
        compare(fast, want_fast, c.type, cmp::peer, what + ": fast mode against the reference backend");
        compare(exact, want_exact, c.type, cmp::peer, what + ": exact mode against the reference backend");
        check_alone(r, c, ws, make_s, exact, fast, what);
        if (rr.scalar) {
            const outputs ref = run_scalar(rr, c, ws);
            compare(exact, ref, c.type, cmp::scalar, what + ": exact mode against the scalar reference");
            compare(fast, ref, c.type, cmp::scalar, what + ": fast mode against the scalar reference");
        }
    });
}

}  // namespace conformance
