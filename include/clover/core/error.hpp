#pragma once
// One exception type for everything that can go wrong at load or parse time. The message names
// the thing at fault (file, key, tensor, flag) so that a front end can print it as one line.
#include <stdexcept>
#include <string>
#include <utility>

namespace clover {

class error : public std::runtime_error {
public:
    explicit error(const std::string& what) : std::runtime_error(what) {}
};

// Builds the message from pieces: fail("tensor '", name, "': expected ", n, " rows").
template <class... Parts>
[[noreturn]] inline void fail(Parts&&... parts) {
    std::string msg;
    auto append = [&msg](auto&& p) {
        using P = std::decay_t<decltype(p)>;
        if constexpr (std::is_arithmetic_v<P> && !std::is_same_v<P, char> && !std::is_same_v<P, bool>)
            msg += std::to_string(p);
        else if constexpr (std::is_same_v<P, bool>)
            msg += p ? "true" : "false";
        else
            msg += p;
    };
    (append(std::forward<Parts>(parts)), ...);
    throw error(msg);
}

}  // namespace clover
