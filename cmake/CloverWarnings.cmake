# Flags for the project's own executables (not forced on consumers of the header library).
add_library(clover_build_flags INTERFACE)
# GCC 12 warns inside its own avx512fintrin.h when Eigen uses _mm512_undefined_*: noise, not ours.
target_compile_options(clover_build_flags INTERFACE -Wall -Wextra -Wno-unused-parameter
    $<$<CXX_COMPILER_ID:GNU>:-Wno-uninitialized -Wno-maybe-uninitialized>)
if(CLOVER_NATIVE)
    target_compile_options(clover_build_flags INTERFACE -march=native)
endif()
if(CLOVER_SANITIZE)
    target_compile_options(clover_build_flags INTERFACE -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
    target_link_options(clover_build_flags INTERFACE -fsanitize=address,undefined)
endif()
