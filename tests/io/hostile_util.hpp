#pragma once
// Helpers for the hostile-file tests (io/, hf/, tokenizer/, cli/): FIFOs that would block a
// reader, a watchdog that releases such a reader so an unfixed build fails instead of hanging,
// whole-file snapshots (an input must come out byte for byte unchanged) and folder listings
// (a failed writer must leave nothing behind).
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace hostile {

namespace fs = std::filesystem;

// A fresh FIFO at p (whatever was there is removed).
inline void make_fifo(const fs::path& p) {
    std::error_code ec;
    fs::remove(p, ec);
    if (::mkfifo(p.c_str(), 0600) != 0) throw std::runtime_error("mkfifo " + p.string() + " failed");
}

// While alive: after `after_s` seconds, opens the FIFO's write end once (non-blocking), which
// releases a reader blocked in open(). A fixed reader never blocks, so the test measures the
// time; an unfixed one is held for after_s, then fails the time check instead of hanging.
class fifo_release {
public:
    explicit fifo_release(fs::path fifo, double after_s = 3.0) : fifo_(std::move(fifo)) {
        thread_ = std::thread([this, after_s] {
            const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(after_s);
            while (!done_ && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            while (!done_) {  // keep releasing until the test is over (a reader may open it twice)
                const int fd = ::open(fifo_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
                if (fd >= 0) {
                    std::this_thread::sleep_for(std::chrono::milliseconds(20));
                    ::close(fd);
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
        });
    }
    fifo_release(const fifo_release&) = delete;
    fifo_release& operator=(const fifo_release&) = delete;
    ~fifo_release() {
        done_ = true;
        thread_.join();
    }

private:
    fs::path fifo_;
    std::atomic<bool> done_{false};
    std::thread thread_;
};

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

inline std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

inline void write_text(const fs::path& p, const std::string& s) {
    std::ofstream(p, std::ios::binary).write(s.data(), std::streamsize(s.size()));
}

// The names in a folder (not recursive).
inline std::set<std::string> listing(const fs::path& dir) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
    return names;
}

inline ino_t inode_of(const fs::path& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 ? st.st_ino : 0;
}

}  // namespace hostile
