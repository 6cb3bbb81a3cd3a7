#pragma once
// An independent plain-loop reference of the whole qwen35moe forward pass (architecture.md §2),
// written from the spec rather than from the library's layers: every weight is dequantized to
// f32 up front, tokens go through one at a time, GDN uses the literal recurrence, attention is
// a naive softmax over the cache, RoPE uses HF's inv_freq formula. No Eigen, no threads, no
// shared code with include/clover/layers except the GGUF reader and row dequantizers.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <clover/io/gguf.hpp>
#include <clover/quant/rows.hpp>

namespace ref {

using vec = std::vector<float>;

struct mat {  // rows × cols, row-major, f32
    std::int64_t rows = 0, cols = 0;
    vec w;
    clover::dtype stored = clover::dtype::f32;  // the file's type of these weights
    // y = W x. As llama.cpp does, x is first rounded to the partner type of the weights' storage
    // type (F16 -> F16, BF16 -> BF16, Q8_0 -> Q8_0 blocks); the product itself is in double.
    vec apply(vec x) const {
        const clover::dtype at = clover::quant::activation_type(stored);
        if (at != clover::dtype::f32) {
            std::vector<std::byte> q(clover::quant::row_bytes(at, cols));
            clover::quant::quantize_row(at, x.data(), q.data(), cols);
            clover::quant::dequantize_row(at, q.data(), x.data(), cols);
        }
        vec y(static_cast<std::size_t>(rows), 0.f);
        for (std::int64_t r = 0; r < rows; ++r) {
            double s = 0;
            for (std::int64_t c = 0; c < cols; ++c) s += double(w[r * cols + c]) * x[c];
            y[r] = float(s);
        }
        return y;
    }
};

inline float sigm(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float silu(float x) { return x * sigm(x); }

inline vec rmsnorm(const vec& x, const float* w, std::size_t off, std::size_t n, float eps) {
    double ss = 0;
    for (std::size_t i = 0; i < n; ++i) ss += double(x[off + i]) * x[off + i];
    const double r = 1.0 / std::sqrt(ss / double(n) + eps);
    vec y(n);
    for (std::size_t i = 0; i < n; ++i) y[i] = float(x[off + i] * r * w[i]);
    return y;
}

class model {
public:
    explicit model(const std::string& path) : f_(path) {
        arch_ = *f_.get_string("general.architecture");
        auto I = [&](const std::string& k) { return *f_.get_int(arch_ + "." + k); };
        E = I("embedding_length"); L = I("block_count"); H = I("attention.head_count"); Hkv = I("attention.head_count_kv");
        hd = I("attention.key_length"); rot = I("rope.dimension_count");
        theta = float(*f_.get_float(arch_ + ".rope.freq_base"));
        eps = float(*f_.get_float(arch_ + ".attention.layer_norm_rms_epsilon"));
        Kc = I("ssm.conv_kernel"); dk = I("ssm.state_size"); Hk = I("ssm.group_count"); Hv = I("ssm.time_step_rank");
        dv = I("ssm.inner_size") / Hv; X = I("expert_count"); k_used = I("expert_used_count");
        F = I("expert_feed_forward_length"); Fs = I("expert_shared_feed_forward_length");
        interval = I("full_attention_interval");
        auto sec = f_.get_int_array(arch_ + ".rope.dimension_sections");
        if (sec) for (std::size_t i = 0; i < sec->size(); ++i) sections[i] = int((*sec)[i]);
        Vocab = f_.tensor("token_embd.weight").ne[1];
        conv_ch = 2 * Hk * dk + Hv * dv;
        for (std::int64_t l = 0; l < L; ++l) {
            layer_state st;
            st.S.assign(static_cast<std::size_t>(Hv * dk * dv), 0.f);
            st.conv.assign(static_cast<std::size_t>(Kc * conv_ch), 0.f);  // last Kc inputs; [0] oldest
            state_.push_back(st);
        }
    }

    std::int64_t n_vocab() const { return Vocab; }

    // Feeds one token at position pos (= number of tokens fed so far); returns its logits.
    vec step(std::int32_t id) {
        const std::int64_t pos = pos_++;
        vec h = row("token_embd.weight", id);
        for (std::int64_t l = 0; l < L; ++l) {
            const std::string p = "blk." + std::to_string(l) + ".";
            vec u = rmsnorm(h, vecf(p + "attn_norm.weight").data(), 0, std::size_t(E), eps);
            vec y = ((l + 1) % interval == 0) ? attention(p, l, u, pos) : deltanet(p, l, u);
            for (std::int64_t i = 0; i < E; ++i) h[i] += y[i];
            u = rmsnorm(h, vecf(p + "post_attention_norm.weight").data(), 0, std::size_t(E), eps);
            y = moe(p, u);
            for (std::int64_t i = 0; i < E; ++i) h[i] += y[i];
        }
        vec u = rmsnorm(h, vecf("output_norm.weight").data(), 0, std::size_t(E), eps);
        return f_.find_tensor("output.weight") ? get("output.weight").apply(u) : get("token_embd.weight").apply(u);
    }

    // One preview pass (clover-diffusion.md §3) over `block` at positions pos.., read-only on the
    // state: bidirectional block attention over the cache, GDN look-ahead conv + block softmax
    // with the history slot, MoE restricted to the coreset. Rows: the logits of each position.
    std::vector<vec> preview(const std::vector<std::int32_t>& block, std::int64_t coreset) {
        const std::size_t B = block.size();
        std::vector<vec> h;
        for (auto id : block) h.push_back(row("token_embd.weight", id));
        for (std::int64_t l = 0; l < L; ++l) {
            const std::string p = "blk." + std::to_string(l) + ".";
            std::vector<vec> u(B);
            for (std::size_t t = 0; t < B; ++t) u[t] = rmsnorm(h[t], vecf(p + "attn_norm.weight").data(), 0, std::size_t(E), eps);
            std::vector<vec> y = ((l + 1) % interval == 0) ? preview_attention(p, l, u) : preview_deltanet(p, l, u);
            for (std::size_t t = 0; t < B; ++t) {
                for (std::int64_t i = 0; i < E; ++i) h[t][i] += y[t][i];
                u[t] = rmsnorm(h[t], vecf(p + "post_attention_norm.weight").data(), 0, std::size_t(E), eps);
            }
            y = preview_moe(p, u, coreset);
            for (std::size_t t = 0; t < B; ++t)
                for (std::int64_t i = 0; i < E; ++i) h[t][i] += y[t][i];
        }
        std::vector<vec> out;
        for (std::size_t t = 0; t < B; ++t) {
            vec u = rmsnorm(h[t], vecf("output_norm.weight").data(), 0, std::size_t(E), eps);
            out.push_back(f_.find_tensor("output.weight") ? get("output.weight").apply(u) : get("token_embd.weight").apply(u));
        }
        return out;
    }

private:
    struct layer_state {
        vec S, conv;
        std::vector<vec> K, V;  // per cached position: [Hkv*hd]
    };

    const mat& get(const std::string& name) {
        auto it = cache_.find(name);
        if (it != cache_.end()) return it->second;
        const auto& t = f_.tensor(name);
        mat m;
        m.stored = t.type;
        m.cols = t.ne[0];
        m.rows = t.nrows();
        m.w.resize(static_cast<std::size_t>(m.rows * m.cols));
        for (std::int64_t r = 0; r < m.rows; ++r)
            clover::quant::dequantize_row(t.type, t.data + std::size_t(r) * t.row_bytes(), m.w.data() + r * m.cols, m.cols);
        return cache_.emplace(name, std::move(m)).first->second;
    }
    const vec& vecf(const std::string& name) { return get(name).w; }
    vec row(const std::string& name, std::int64_t r) {
        const mat& m = get(name);
        return vec(m.w.begin() + r * m.cols, m.w.begin() + (r + 1) * m.cols);
    }
    // Expert e's matrix out of a stacked [X][rows][cols] tensor.
    mat expert(const std::string& name, std::int64_t e) {
        const mat& all = get(name);
        const auto& t = f_.tensor(name);
        mat m;
        m.stored = t.type;
        m.cols = t.ne[0];
        m.rows = t.ne[1];
        m.w.assign(all.w.begin() + e * m.rows * m.cols, all.w.begin() + (e + 1) * m.rows * m.cols);
        return m;
    }

    void rope(float* x, std::int64_t pos) const {
        const std::int64_t half = rot / 2;
        const int sect = sections[0] + sections[1] + sections[2] + sections[3];
        for (std::int64_t i = 0; i < half; ++i) {
            double p = double(pos);
            if (sect > 0) {  // interleaved M-RoPE: text uses pos for t/h/w streams, 0 for the extra one
                const int s = int(i % sect);
                const bool used = (s % 3 == 0 && s < 3 * sections[0]) || (s % 3 == 1 && s < 3 * sections[1]) ||
                                  (s % 3 == 2 && s < 3 * sections[2]);
                if (!used) p = 0;
            }
            const double inv_freq = std::pow(double(theta), -2.0 * double(i) / double(rot));
            const double a = p * inv_freq;
            const float c = float(std::cos(a)), s = float(std::sin(a));
            const float x0 = x[i], x1 = x[i + half];
            x[i] = x0 * c - x1 * s;
            x[i + half] = x1 * c + x0 * s;
        }
    }

    vec attention(const std::string& p, std::int64_t l, const vec& u, std::int64_t pos) {
        vec qg = get(p + "attn_q.weight").apply(u);  // [H][2*hd]
        vec k = get(p + "attn_k.weight").apply(u), v = get(p + "attn_v.weight").apply(u);
        const vec& qn = vecf(p + "attn_q_norm.weight");
        const vec& kn = vecf(p + "attn_k_norm.weight");
        vec kk(static_cast<std::size_t>(Hkv * hd));
        for (std::int64_t j = 0; j < Hkv; ++j) {
            vec t = rmsnorm(k, kn.data(), std::size_t(j * hd), std::size_t(hd), eps);
            rope(t.data(), pos);
            std::copy(t.begin(), t.end(), kk.begin() + j * hd);
        }
        auto& st = state_[l];
        st.K.push_back(kk);
        st.V.push_back(v);
        vec o(static_cast<std::size_t>(H * hd));
        for (std::int64_t h = 0; h < H; ++h) {
            vec q = rmsnorm(qg, qn.data(), std::size_t(h * 2 * hd), std::size_t(hd), eps);
            rope(q.data(), pos);
            const std::int64_t j = h / (H / Hkv);
            std::vector<double> sc(st.K.size());
            double mx = -1e300;
            for (std::size_t t = 0; t < st.K.size(); ++t) {
                double s = 0;
                for (std::int64_t i = 0; i < hd; ++i) s += double(q[i]) * st.K[t][j * hd + i];
                sc[t] = s / std::sqrt(double(hd));
                mx = std::max(mx, sc[t]);
            }
            double z = 0;
            for (auto& s : sc) z += (s = std::exp(s - mx));
            for (std::int64_t i = 0; i < hd; ++i) {
                double acc = 0;
                for (std::size_t t = 0; t < st.K.size(); ++t) acc += sc[t] / z * st.V[t][j * hd + i];
                o[h * hd + i] = float(acc) * sigm(qg[h * 2 * hd + hd + i]);
            }
        }
        return get(p + "attn_output.weight").apply(o);
    }

    vec deltanet(const std::string& p, std::int64_t l, const vec& u) {
        auto& st = state_[l];
        vec mixed = get(p + "attn_qkv.weight").apply(u);
        vec z = get(p + "attn_gate.weight").apply(u);
        vec b = get(p + "ssm_beta.weight").apply(u);
        vec a = get(p + "ssm_alpha.weight").apply(u);
        // Conv window: shift in the new input, keep the last Kc.
        for (std::int64_t r = 0; r + 1 < Kc; ++r)
            for (std::int64_t c = 0; c < conv_ch; ++c) st.conv[r * conv_ch + c] = st.conv[(r + 1) * conv_ch + c];
        for (std::int64_t c = 0; c < conv_ch; ++c) st.conv[(Kc - 1) * conv_ch + c] = mixed[c];
        const vec& w = vecf(p + "ssm_conv1d.weight");  // [conv_ch][Kc]
        vec y(static_cast<std::size_t>(conv_ch));
        for (std::int64_t c = 0; c < conv_ch; ++c) {
            double s = 0;
            for (std::int64_t i = 0; i < Kc; ++i) s += double(w[c * Kc + i]) * st.conv[i * conv_ch + c];
            y[c] = silu(float(s));
        }
        auto l2 = [&](float* x, std::int64_t n) {
            double ss = 0;
            for (std::int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
            for (std::int64_t i = 0; i < n; ++i) x[i] = float(x[i] / std::sqrt(ss + eps));
        };
        for (std::int64_t h = 0; h < Hk; ++h) {
            l2(&y[h * dk], dk);
            l2(&y[Hk * dk + h * dk], dk);
        }
        const vec& dt = vecf(p + "ssm_dt.bias");
        const vec& A = vecf(p + "ssm_a");
        const vec& nw = vecf(p + "ssm_norm.weight");
        vec o(static_cast<std::size_t>(Hv * dv));
        for (std::int64_t h = 0; h < Hv; ++h) {
            const std::int64_t kh = h % Hk;  // GGUF: tiled V-head order
            const float* q = &y[kh * dk];
            const float* k = &y[Hk * dk + kh * dk];
            const float* v = &y[2 * Hk * dk + h * dv];
            const float x = a[h] + dt[h];
            const float sp = x > 20.f ? x : std::log1p(std::exp(x));
            const float decay = std::exp(A[h] * sp), beta = sigm(b[h]);
            float* S = &st.S[h * dk * dv];
            for (std::int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;
            for (std::int64_t j = 0; j < dv; ++j) {
                double kv = 0;
                for (std::int64_t i = 0; i < dk; ++i) kv += double(S[i * dv + j]) * k[i];
                const float delta = beta * (v[j] - float(kv));
                for (std::int64_t i = 0; i < dk; ++i) S[i * dv + j] += k[i] * delta;
            }
            vec oh(static_cast<std::size_t>(dv));
            for (std::int64_t j = 0; j < dv; ++j) {
                double s = 0;
                for (std::int64_t i = 0; i < dk; ++i) s += double(S[i * dv + j]) * q[i] / std::sqrt(double(dk));
                oh[j] = float(s);
            }
            vec n = rmsnorm(oh, nw.data(), 0, std::size_t(dv), eps);
            for (std::int64_t j = 0; j < dv; ++j) o[h * dv + j] = n[j] * silu(z[h * dv + j]);
        }
        return get(p + "ssm_out.weight").apply(o);
    }

    std::vector<vec> preview_attention(const std::string& p, std::int64_t l, const std::vector<vec>& u) {
        const std::int64_t B = std::int64_t(u.size()), base = pos_;
        const vec& qn = vecf(p + "attn_q_norm.weight");
        const vec& kn = vecf(p + "attn_k_norm.weight");
        std::vector<vec> qg(u.size()), K = state_[l].K, V = state_[l].V;  // cached rows, then the block's
        for (std::int64_t t = 0; t < B; ++t) {
            qg[t] = get(p + "attn_q.weight").apply(u[t]);
            vec k = get(p + "attn_k.weight").apply(u[t]), kk(static_cast<std::size_t>(Hkv * hd));
            for (std::int64_t j = 0; j < Hkv; ++j) {
                vec r = rmsnorm(k, kn.data(), std::size_t(j * hd), std::size_t(hd), eps);
                rope(r.data(), base + t);
                std::copy(r.begin(), r.end(), kk.begin() + j * hd);
            }
            K.push_back(kk);
            V.push_back(get(p + "attn_v.weight").apply(u[t]));
        }
        std::vector<vec> out;
        for (std::int64_t t = 0; t < B; ++t) {
            vec o(static_cast<std::size_t>(H * hd));
            for (std::int64_t h = 0; h < H; ++h) {
                vec q = rmsnorm(qg[t], qn.data(), std::size_t(h * 2 * hd), std::size_t(hd), eps);
                rope(q.data(), base + t);
                const std::int64_t j = h / (H / Hkv);
                std::vector<double> sc(K.size());
                double mx = -1e300, z = 0;
                for (std::size_t s2 = 0; s2 < K.size(); ++s2) {
                    double d = 0;
                    for (std::int64_t i = 0; i < hd; ++i) d += double(q[i]) * K[s2][j * hd + i];
                    mx = std::max(mx, sc[s2] = d / std::sqrt(double(hd)));
                }
                for (auto& x : sc) z += (x = std::exp(x - mx));
                for (std::int64_t i = 0; i < hd; ++i) {
                    double acc = 0;
                    for (std::size_t s2 = 0; s2 < K.size(); ++s2) acc += sc[s2] / z * V[s2][j * hd + i];
                    o[h * hd + i] = float(acc) * sigm(qg[t][h * 2 * hd + hd + i]);
                }
            }
            out.push_back(get(p + "attn_output.weight").apply(o));
        }
        return out;
    }

    std::vector<vec> preview_deltanet(const std::string& p, std::int64_t l, const std::vector<vec>& u) {
        const auto& st = state_[l];
        const std::int64_t B = std::int64_t(u.size());
        std::vector<vec> m, z;
        for (const auto& x : u) {
            m.push_back(get(p + "attn_qkv.weight").apply(x));
            z.push_back(get(p + "attn_gate.weight").apply(x));
        }
        const vec& w = vecf(p + "ssm_conv1d.weight");         // [C][Kc]
        const vec& wr = vecf(p + "ssm_conv1d_right.weight");  // [C][Kc-1]
        auto input = [&](std::int64_t tau, std::int64_t c) -> double {
            if (tau < 0) return st.conv[(Kc + tau) * conv_ch + c];  // the clean window, [Kc-1] = newest
            return tau < B ? m[tau][c] : 0.0;
        };
        std::vector<vec> y(u.size(), vec(static_cast<std::size_t>(conv_ch)));
        for (std::int64_t t = 0; t < B; ++t)
            for (std::int64_t c = 0; c < conv_ch; ++c) {
                double s = 0;
                for (std::int64_t i = 0; i < Kc; ++i) s += w[c * Kc + i] * input(t - Kc + 1 + i, c);
                for (std::int64_t d = 1; d < Kc; ++d) s += wr[c * (Kc - 1) + d - 1] * input(t + d, c);
                y[t][c] = silu(float(s));
            }
        auto unit = [&](float* x, std::int64_t n) {
            double ss = 0;
            for (std::int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
            for (std::int64_t i = 0; i < n; ++i) x[i] = float(x[i] / std::sqrt(ss + eps));
        };
        for (auto& r : y)
            for (std::int64_t h = 0; h < Hk; ++h) {
                unit(&r[h * dk], dk);
                unit(&r[Hk * dk + h * dk], dk);
            }
        const vec& lam = vecf(p + "ssm_bd_logit_scale");
        const vec& hb = vecf(p + "ssm_bd_history_bias");
        const vec& hc = vecf(p + "ssm_bd_history_c");
        const vec& nw = vecf(p + "ssm_norm.weight");
        std::vector<vec> out;
        for (std::int64_t t = 0; t < B; ++t) {
            vec o(static_cast<std::size_t>(Hv * dv));
            for (std::int64_t h = 0; h < Hv; ++h) {
                const std::int64_t kh = h % Hk;
                const float* q = &y[t][kh * dk];
                std::vector<double> a(static_cast<std::size_t>(B + 1));
                a[0] = hb[h];
                for (std::int64_t s2 = 0; s2 < B; ++s2) {
                    double d = 0;
                    for (std::int64_t i = 0; i < dk; ++i) d += double(q[i]) * y[s2][Hk * dk + kh * dk + i];
                    a[1 + s2] = lam[h] * d;
                }
                double mx = *std::max_element(a.begin(), a.end()), zs = 0;
                for (auto& x : a) zs += (x = std::exp(x - mx));
                vec oh(static_cast<std::size_t>(dv));
                for (std::int64_t j = 0; j < dv; ++j) {
                    double r = 0;
                    for (std::int64_t i = 0; i < dk; ++i) r += double(st.S[(h * dk + i) * dv + j]) * q[i] / std::sqrt(double(dk));
                    double acc = a[0] / zs * hc[h] * r;
                    for (std::int64_t s2 = 0; s2 < B; ++s2) acc += a[1 + s2] / zs * y[s2][2 * Hk * dk + h * dv + j];
                    oh[j] = float(acc);
                }
                vec n = rmsnorm(oh, nw.data(), 0, std::size_t(dv), eps);
                for (std::int64_t j = 0; j < dv; ++j) o[h * dv + j] = n[j] * silu(z[t][h * dv + j]);
            }
            out.push_back(get(p + "ssm_out.weight").apply(o));
        }
        return out;
    }

    std::vector<vec> preview_moe(const std::string& p, const std::vector<vec>& u, std::int64_t C) {
        std::vector<std::vector<double>> pr;
        for (const auto& x : u) pr.push_back(probs(p, x));
        std::vector<bool> allowed(static_cast<std::size_t>(X), true);
        if (C > 0 && C < X) {
            std::vector<double> score(static_cast<std::size_t>(X), 0.0);
            for (const auto& r : pr)
                for (std::int64_t e = 0; e < X; ++e) score[e] += r[e];
            std::fill(allowed.begin(), allowed.end(), false);
            for (std::int64_t c = 0; c < C; ++c) {
                std::int64_t best = -1;
                for (std::int64_t e = 0; e < X; ++e)
                    if (!allowed[e] && (best < 0 || score[e] > score[best])) best = e;
                allowed[best] = true;
            }
        }
        std::vector<vec> out;
        for (std::size_t t = 0; t < u.size(); ++t) out.push_back(moe_with(p, u[t], pr[t], allowed));
        return out;
    }

    std::vector<double> probs(const std::string& p, const vec& u) {
        vec logits = get(p + "ffn_gate_inp.weight").apply(u);
        double mx = -1e300, z = 0;
        for (float x : logits) mx = std::max(mx, double(x));
        std::vector<double> pr(logits.size());
        for (std::size_t e = 0; e < pr.size(); ++e) z += (pr[e] = std::exp(logits[e] - mx));
        for (auto& x : pr) x /= z;
        return pr;
    }

    vec moe(const std::string& p, const vec& u) {
        return moe_with(p, u, probs(p, u), std::vector<bool>(static_cast<std::size_t>(X), true));
    }

    // Top-k among the allowed experts (k' = min(k, |allowed|)), renormalised, plus the shared expert.
    vec moe_with(const std::string& p, const vec& u, const std::vector<double>& pr, std::vector<bool> allowed) {
        std::int64_t n_allowed = 0;
        for (bool a : allowed) n_allowed += a;
        std::vector<std::int64_t> chosen;
        for (std::int64_t j = 0; j < std::min(k_used, n_allowed); ++j) {
            std::int64_t best = -1;
            for (std::int64_t e = 0; e < X; ++e)
                if (allowed[e] && (best < 0 || pr[e] > pr[best])) best = e;
            allowed[best] = false;
            chosen.push_back(best);
        }
        double wsum = 0;
        for (auto e : chosen) wsum += pr[e];
        vec out(static_cast<std::size_t>(E), 0.f);
        auto ffn = [&](const mat& g, const mat& up, const mat& down) {
            vec a = g.apply(u), b = up.apply(u);
            for (std::size_t i = 0; i < a.size(); ++i) a[i] = silu(a[i]) * b[i];
            return down.apply(a);
        };
        for (auto e : chosen) {
            vec y = ffn(expert(p + "ffn_gate_exps.weight", e), expert(p + "ffn_up_exps.weight", e),
                        expert(p + "ffn_down_exps.weight", e));
            for (std::int64_t i = 0; i < E; ++i) out[i] += float(pr[e] / wsum) * y[i];
        }
        if (f_.find_tensor(p + "ffn_gate_shexp.weight")) {
            vec y = ffn(get(p + "ffn_gate_shexp.weight"), get(p + "ffn_up_shexp.weight"), get(p + "ffn_down_shexp.weight"));
            const vec& g = vecf(p + "ffn_gate_inp_shexp.weight");
            double s = 0;
            for (std::int64_t i = 0; i < E; ++i) s += double(g[i]) * u[i];
            const float gate = sigm(float(s));
            for (std::int64_t i = 0; i < E; ++i) out[i] += gate * y[i];
        }
        return out;
    }

    clover::io::gguf_file f_;
    std::string arch_;
    std::int64_t E, L, H, Hkv, hd, rot, Kc, dk, Hk, Hv, dv, X, k_used, F, Fs, interval, Vocab, conv_ch;
    int sections[4] = {0, 0, 0, 0};
    float theta, eps;
    std::map<std::string, mat> cache_;
    std::vector<layer_state> state_;
    std::int64_t pos_ = 0;
};

}  // namespace ref
