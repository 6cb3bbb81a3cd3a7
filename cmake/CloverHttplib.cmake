# cpp-httplib as Debian ships it (libcpp-httplib-dev: a compiled library plus its header, built
# with OpenSSL, zlib and Brotli support, so users must compile with the same defines, which
# pkg-config gives). nlohmann/json is header-only in /usr/include. Defines the target clover::httplib once.
# 0.11.4 alone has no request deadline, queue bound or body bound for chunked/compressed bodies;
# include/clover/server/guard.hpp adds them (and says why we stay on this package).
if(NOT TARGET clover::httplib)
    find_package(PkgConfig REQUIRED)
    pkg_check_modules(CLOVER_HTTPLIB REQUIRED IMPORTED_TARGET GLOBAL cpp-httplib)
    add_library(clover_httplib INTERFACE)
    add_library(clover::httplib ALIAS clover_httplib)
    target_link_libraries(clover_httplib INTERFACE PkgConfig::CLOVER_HTTPLIB Threads::Threads)
endif()
