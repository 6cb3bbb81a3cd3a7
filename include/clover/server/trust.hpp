#pragma once
// Who may talk to the server. Three questions, asked of every request before it is routed:
//   * the API key (when one is set): compared in constant time, from "Authorization: Bearer K"
//     or "X-Api-Key: K";
//   * the Host header, when the server listens on a loopback address: only loopback names
//     (127.0.0.1, localhost, [::1]) and names allowed with --allow-host. A page on
//     evil.example whose DNS later points at 127.0.0.1 (DNS rebinding) sends
//     "Host: evil.example" and is refused;
//   * the Origin header, which browsers add to cross-origin requests (and to every POST):
//     refused unless it is the server's own origin or --cors allows it ("*": any). Programs
//     (curl, SDKs) send no Origin and are not affected. A cross-site form or text/plain POST
//     needs no CORS preflight, so refusing it here, before the handler runs, is what stops it.
#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <vector>

namespace clover::server {

// Equal without an early exit: the time depends on the length of `given` only, not on
// where it first differs from `expected`.
inline bool constant_time_equal(std::string_view given, std::string_view expected) {
    volatile unsigned char diff = given.size() == expected.size() ? 0 : 1;
    const std::size_t n = expected.size();
    for (std::size_t i = 0; i < given.size(); ++i)
        diff = diff | static_cast<unsigned char>(given[i] ^ (n ? expected[i % n] : 0));
    return diff == 0;
}

inline std::string lower(std::string_view s) {
    std::string out(s);
    for (auto& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// "name:port" / "[v6]:port" / "name" → "name" (v6 without brackets), lower case.
inline std::string host_name(std::string_view host) {
    if (host.starts_with("[")) {
        const auto close = host.find(']');
        return lower(host.substr(1, close == std::string_view::npos ? std::string_view::npos : close - 1));
    }
    const auto colon = host.find(':');
    if (colon != std::string_view::npos && host.find(':', colon + 1) == std::string_view::npos) host = host.substr(0, colon);
    return lower(host);
}

inline bool is_loopback_name(std::string_view name) {
    if (name == "localhost" || name == "::1" || name == "0:0:0:0:0:0:0:1") return true;
    if (!name.starts_with("127.")) return false;  // 127.0.0.0/8, as a dotted quad
    int dots = 0;
    for (char c : name) {
        if (c == '.') ++dots;
        else if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    }
    return dots == 3;
}

struct access_policy {
    std::string api_key;                   // empty: no key needed
    std::vector<std::string> more_keys;    // each as good as api_key (one per tenant)
    std::vector<std::string> cors_origins; // allowed cross-origin callers; "*": any
    std::vector<std::string> allowed_hosts;// extra Host names (a reverse proxy's), loopback servers only
    bool loopback = true;                  // listening on a loopback address: check Host

    bool key_ok(std::string_view authorization, std::string_view x_api_key) const {
        return api_key.empty() || key_index(authorization, x_api_key) >= 0;
    }
    // Which key the request gives: 0 for api_key, 1 + i for more_keys[i]; -1: none of them.
    // Every key is compared (in constant time), whichever matches.
    int key_index(std::string_view authorization, std::string_view x_api_key) const {
        int found = -1;
        const bool bearer = authorization.size() > 7 && lower(authorization.substr(0, 7)) == "bearer ";
        for (std::size_t i = 0; i <= more_keys.size(); ++i) {
            const std::string& k = i == 0 ? api_key : more_keys[i - 1];
            if (k.empty()) continue;
            bool ok = bearer && constant_time_equal(authorization.substr(7), k);
            if (!x_api_key.empty()) ok = constant_time_equal(x_api_key, k) || ok;
            if (ok && found < 0) found = int(i);
        }
        return found;
    }

    // An absent Host (HTTP/1.0) passes: browsers always send one.
    bool host_ok(std::string_view host) const {
        if (!loopback || host.empty()) return true;
        const std::string name = host_name(host);
        if (is_loopback_name(name)) return true;
        return std::any_of(allowed_hosts.begin(), allowed_hosts.end(), [&](const std::string& h) { return lower(h) == name; });
    }

    enum class origin_kind { none, same, allowed, refused };
    // none: no Origin (not a browser); same: a page of this very host; allowed: --cors.
    origin_kind origin(std::string_view origin, std::string_view host) const {
        if (origin.empty()) return origin_kind::none;
        const std::string o = lower(origin);
        if (!host.empty() && (o == "http://" + lower(host) || o == "https://" + lower(host))) return origin_kind::same;
        for (const auto& c : cors_origins)
            if (c == "*" || lower(c) == o) return origin_kind::allowed;
        return origin_kind::refused;
    }
    bool any_origin() const { return std::find(cors_origins.begin(), cors_origins.end(), "*") != cors_origins.end(); }
};

}  // namespace clover::server
