#pragma once
// The emulated device's kernel language (cuda/emu/README.md): a block's threads are fibers that
// switch only at the collectives below (__syncthreads, __syncwarp, shuffles, mma, CUB's block
// reduction), so everything between two collectives runs as one uninterrupted step of one thread,
// in an order the emulator picks (forward, reverse or seeded random). Kernels are plain host
// functions; launch() (runtime.cpp) runs the grid's blocks one after another.
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "clover_emu/types.hpp"

namespace clover_emu {

using loc_t = std::source_location;

// The fiber running now: its indices, read by the threadIdx/blockIdx/... macros.
struct thread_view {
    uint3 tid;
    int linear;
};
struct block_view {
    uint3 bid;
    dim3 bdim, gdim;
};
inline thread_local thread_view* current_thread = nullptr;
inline thread_local block_view* current_block = nullptr;

// ---- collectives (fiber.cpp): each blocks the calling fiber until its peers arrive
void syncthreads(loc_t loc);
void syncwarp(unsigned mask, loc_t loc);
enum class shfl_kind { idx, xor_, down, up };
std::uint64_t shfl(unsigned mask, std::uint64_t bits, shfl_kind kind, int arg, int width, loc_t loc);
// mma.sync.aligned.m16n8k{32,16}.row.col.s32.s8.s8.s32 with C = 0 (mma.cpp): d = A·B.
void mma_s8(int k, int (&d)[4], const std::uint32_t* a, const std::uint32_t* b, loc_t loc);
inline void mma_m16n8k32_s8(int (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2], loc_t loc = loc_t::current()) {
    mma_s8(32, d, a, b, loc);
}
inline void mma_m16n8k16_s8(int (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2], loc_t loc = loc_t::current()) {
    mma_s8(16, d, a, b, loc);
}
// A block-wide collective that computes from every thread's deposit at the barrier's release:
// fn(deposits, n_threads, results) (CUB's BlockReduce).
using collective_fn = void (*)(const std::uint64_t* in, int n, std::uint64_t* out, const void* ctx);
std::uint64_t block_collective(std::uint64_t bits, collective_fn fn, const void* ctx, loc_t loc);

// ---- shared memory (fiber.cpp): per block, from an arena poisoned at each block's start
void* static_shared_alloc(const void* key, std::size_t bytes, std::size_t align);
void* dynamic_shared_base(std::size_t* bytes);
// Race detector entry: an access of `bytes` at p by the current thread (race.cpp).
void shared_access(const void* p, std::size_t bytes, bool write, loc_t loc);
[[noreturn]] void index_error(std::ptrdiff_t i, std::size_t n, loc_t loc);


// A checked reference into shared memory: reads and writes go through the race detector.
template <class T>
class sref {
public:
    sref(T* p, loc_t loc) : p_(p), loc_(loc) {}
    operator std::remove_const_t<T>() const {
        shared_access(p_, sizeof(T), false, loc_);
        return *p_;
    }
    sref& operator=(const std::remove_const_t<T>& v)
        requires(!std::is_const_v<T>)
    {
        shared_access(p_, sizeof(T), true, loc_);
        *p_ = v;
        return *this;
    }
    sref& operator=(const sref& o)
        requires(!std::is_const_v<T>)
    {
        return *this = static_cast<std::remove_const_t<T>>(o);
    }
    template <class U>
    sref& operator+=(const U& v) { return *this = static_cast<std::remove_const_t<T>>(*this) + v; }
    template <class U>
    sref& operator-=(const U& v) { return *this = static_cast<std::remove_const_t<T>>(*this) - v; }
    template <class U>
    sref& operator*=(const U& v) { return *this = static_cast<std::remove_const_t<T>>(*this) * v; }
    template <class U>
    sref& operator/=(const U& v) { return *this = static_cast<std::remove_const_t<T>>(*this) / v; }

private:
    T* p_;
    loc_t loc_;
};

// An index that remembers where it was used (operator[] takes one argument, so the call site
// rides on the index's conversion).
struct sindex {
    std::ptrdiff_t i;
    loc_t loc;
    template <std::integral I>
    sindex(I v, loc_t l = loc_t::current()) : i(std::ptrdiff_t(v)), loc(l) {}
};

// smem_ptr<T> of runtime.cuh under the emulator: a pointer into dynamic shared memory whose
// element accesses are checked (bounds of the block's arena, races between barriers).
template <class T>
class sptr {
public:
    sptr() = default;
    sptr(std::nullptr_t) {}
    explicit sptr(T* p) : p_(p) {}
    explicit operator bool() const { return p_ != nullptr; }
    template <class U>
        requires(std::is_convertible_v<U*, T*> && !std::is_same_v<U, T>)
    sptr(const sptr<U>& o) : p_(o.raw()) {}
    sref<T> operator[](sindex ix) const { return sref<T>(p_ + ix.i, ix.loc); }
    template <std::integral I>
    sptr operator+(I n) const { return sptr(p_ + n); }
    template <std::integral I>
    sptr operator-(I n) const { return sptr(p_ - n); }
    template <std::integral I>
    sptr& operator+=(I n) { p_ += n; return *this; }
    std::ptrdiff_t operator-(const sptr& o) const { return p_ - o.p_; }
    T* raw() const { return p_; }  // unchecked: for what cannot take an sptr
    bool operator==(const sptr&) const = default;

private:
    T* p_ = nullptr;
};
template <std::integral I, class T>
sptr<T> operator+(I n, const sptr<T>& p) { return p + n; }

// A value written into a checked shared scalar, with the call site of the assignment.
template <class T>
struct sval_in {
    T v;
    loc_t loc;
    template <class U>
        requires std::is_convertible_v<U, T>
    sval_in(U x, loc_t l = loc_t::current()) : v(static_cast<T>(x)), loc(l) {}
};
// A scalar in static shared memory whose reads and writes go through the race detector (a read
// is reported at the declaration: a conversion operator cannot learn its call site).
template <class T>
class svar {
public:
    svar(T* p, loc_t decl) : p_(p), decl_(decl) {}
    operator T() const {
        shared_access(p_, sizeof(T), false, decl_);
        return *p_;
    }
    svar& operator=(sval_in<T> x) {
        shared_access(p_, sizeof(T), true, x.loc);
        *p_ = x.v;
        return *this;
    }
    svar& operator=(const svar& o) { return *this = sval_in<T>(static_cast<T>(o)); }

private:
    T* p_;
    loc_t decl_;
};
// A static shared array of N elements E (a number, or a row of numbers): indices are checked
// against N, element accesses go through the race detector.
template <class E, std::size_t N>
class sarr {
public:
    explicit sarr(E* p, loc_t decl) : p_(p), decl_(decl) {}
    auto operator[](sindex ix) const {
        if (ix.i < 0 || std::size_t(ix.i) >= N) index_error(ix.i, N, ix.loc);
        if constexpr (std::is_array_v<E>) return sptr<std::remove_extent_t<E>>(p_[ix.i]);
        else return sref<E>(p_ + ix.i, ix.loc);
    }
    // A 1-D array handed to a function taking a pointer (smem_ptr): its accesses stay checked
    // (against the block's shared memory; the array's own bounds are lost with its type).
    template <class U>
        requires(!std::is_array_v<E> && std::is_convertible_v<E*, U*>)
    operator sptr<U>() const { return sptr<U>(p_); }

private:
    E* p_;
    loc_t decl_;
};

// CLOVER_SHARED under the emulator: numbers and arrays (1-D, 2-D) of numbers come checked (svar,
// sarr); anything else (CUB's storage, structs) as a plain reference into the arena.
template <class T, class Key>
decltype(auto) static_shared(Key, loc_t loc = loc_t::current()) {
    static const char key = 0;
    T* p = static_cast<T*>(static_shared_alloc(&key, sizeof(T), alignof(T)));
    if constexpr (std::is_arithmetic_v<T>) return svar<T>(p, loc);
    else if constexpr (std::is_array_v<T> && std::rank_v<T> <= 2 && std::is_arithmetic_v<std::remove_all_extents_t<T>>)
        return sarr<std::remove_extent_t<T>, std::extent_v<T>>(&(*p)[0], loc);
    else return static_cast<T&>(*p);
}

template <class T>
sptr<T> dynamic_shared() {
    std::size_t n = 0;
    return sptr<T>(static_cast<T*>(dynamic_shared_base(&n)));
}

// ---- launches (runtime.cpp)
// A kernel's __launch_bounds__(max_threads), stated as the kernel's first statement
// (CLOVER_EMU_LAUNCH_BOUND): a block larger than the bound fails the launch before any of the
// kernel runs, and later launches of the kernel are refused at the call (cudaErrorInvalidValue).
void launch_bound(int max_threads, loc_t loc = loc_t::current());
void launch_erased(const void* kernel, const char* name, dim3 grid, dim3 block, std::size_t smem, cudaStream_t s,
                   std::function<void()> body);
// Arguments are kept by value (a graph node replays what was captured).
template <class... P>
void launch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block, std::size_t smem, cudaStream_t s,
            std::type_identity_t<P>... args) {
    launch_erased(reinterpret_cast<const void*>(kernel), name, grid, block, smem, s,
                  [kernel, tup = std::tuple<P...>(std::move(args)...)] { std::apply(kernel, tup); });
}
// Host work in stream order (CUB's device-wide algorithms): runs now, at the stream's turn (lazy
// mode) or when a graph captured from the stream is launched.
void enqueue_host(cudaStream_t s, const char* what, std::function<void()> fn);
// Is [p, p + n) inside one device allocation (cudaMalloc) or pinned host allocation?
bool device_range(const void* p, std::size_t n);

// ---- test API (runtime.cpp)
enum class order { forward, reverse, random };
void set_order(order o, std::uint64_t seed = 0);
order get_order();
void set_poison(std::uint8_t byte);
std::uint8_t poison();
void set_lazy(bool lazy);
// Errors the emulator found (kernel, file:line, what), in order; take_errors() returns and clears
// them (a test that provokes one takes it), error_count() counts those not taken.
std::vector<std::string> take_errors();
int error_count();
void report(std::string msg);  // an error of the current launch (fails it, see runtime.cpp)
// Names (without template arguments) of the kernels launched since the process began.
std::vector<std::string> kernels_launched();

}  // namespace clover_emu
