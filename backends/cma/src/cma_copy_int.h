/* cma_copy.h: the copy the cma backend uses into and out of a peer's mapped
 * memory: memcpy, except where memcpy has a cliff on x86. Header-only so
 * that the unit test runs the very code the module runs.
 *
 * Why not memcpy alone (measured on this project's AMD EPYC (Zen 5) VM,
 * glibc 2.36, ERMS and FSRM; docs/BENCH-LOG.md, "cma: mutually misaligned
 * buffers"): from 2112 B up to 512 KiB glibc copies with `rep movsb`, and
 * there `rep movsb` runs at 0.6-2.8 GB/s instead of 16-60 when the
 * destination is 1 to 31 bytes past the source modulo 64, and up to 4x
 * slower (8 KiB, cached: 14 GB/s against 60) when it is 33 to 63 bytes
 * past. Only (dst - src) % 64 matters: two buffers at the same offset in
 * their cache lines copy at full speed. numpy's arrays start 16 bytes into
 * a page, so a Python stack reading into them from a page-aligned peer hit
 * the slow case on every block. So pieces that are not mutually 64-byte
 * aligned and not small are copied here with unaligned loads and
 * 64-byte-aligned stores. Same machine, same run, dst 8 or 16 bytes past
 * src: 8448 B cached at 66-68 GB/s (AVX2) where memcpy gave 1.7-1.9 (and
 * 75 aligned), 64 KiB cached at 39-41 (SSE2: 32-36) where it gave 1.9,
 * 64 KiB cold at 7.9-8.3 where it gave 1.9-2.0 (8.7 aligned), and equal
 * to memcpy within noise where memcpy has no cliff (1 MiB, 8 MiB).
 * Non-temporal stores were tried and are not used: on cached data they
 * were slower (64 KiB-1 MiB: 15-21 GB/s against 25-33), on cold data
 * 10-35% faster (the most at 8 MiB); this backend copies at most 1 MiB
 * per call by default (inline requests, chunk slices, lanes), and glibc's
 * aligned path keeps plain stores up to 3/4 of the last-level cache, so
 * mutually aligned and misaligned pieces leave the caches in the same
 * state.
 * Elsewhere (not x86-64) this is memcpy: the cliff is glibc's x86
 * rep movsb path, and nothing was measured there. */
#ifndef PDX_CMA_COPY_H
#define PDX_CMA_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#include <immintrin.h>
#endif

/* Below this glibc's memcpy keeps to its vector loops (under 2112 B here)
 * and measured as fast as the AVX2 loop below and faster than the SSE2
 * one at every misalignment (256 B-2 KiB, cached). */
#define CMA_COPY_MIN 2048

#if defined(__x86_64__)

/* The loops below copy `len` >= 64 bytes (under 64: memcpy) with 64-byte-
 * aligned stores to `dst` and unaligned loads from `src`; the first and
 * last 64 bytes are loaded up front and stored unaligned, overlapping the
 * aligned body. src and dst must not overlap (memcpy's contract).
 *
 * Direction: a forward loop's next loads share their low 12 address bits
 * with the stores it has just issued when dst is a little ahead of src
 * modulo 4096 (numpy's 16 bytes is), and the CPU stalls the loads on that
 * false match ("4K aliasing"); copying backward there avoids it, as
 * glibc's own vector loop does. Measured with pdx-bench --misalign 16,
 * READ of 1 MiB pieces: forward 19.5 GB/s median, backward 26.0, glibc's
 * memcpy (no cliff at that size) 25.4. */
#define CMA_COPY_BACKWARD_WITHIN 256

static inline void cma_copy_sse2(void *dst, const void *src, size_t len)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (len < 64) {
        memcpy(d, s, len);
        return;
    }
    uint8_t *last = d + len - 64;
    const uint8_t *sl = s + len - 64;
    __m128i h0 = _mm_loadu_si128((const __m128i *)s);
    __m128i h1 = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i h2 = _mm_loadu_si128((const __m128i *)(s + 32));
    __m128i h3 = _mm_loadu_si128((const __m128i *)(s + 48));
    __m128i t0 = _mm_loadu_si128((const __m128i *)sl);
    __m128i t1 = _mm_loadu_si128((const __m128i *)(sl + 16));
    __m128i t2 = _mm_loadu_si128((const __m128i *)(sl + 32));
    __m128i t3 = _mm_loadu_si128((const __m128i *)(sl + 48));
    size_t k = 64 - ((uintptr_t)d & 63); /* 1..64: the head covers it */
    uint8_t *p = d + k;
    const uint8_t *q = s + k;
    for (; p < last; p += 64, q += 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)q);
        __m128i x1 = _mm_loadu_si128((const __m128i *)(q + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(q + 32));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(q + 48));
        _mm_store_si128((__m128i *)p, x0);
        _mm_store_si128((__m128i *)(p + 16), x1);
        _mm_store_si128((__m128i *)(p + 32), x2);
        _mm_store_si128((__m128i *)(p + 48), x3);
    }
    _mm_storeu_si128((__m128i *)d, h0);
    _mm_storeu_si128((__m128i *)(d + 16), h1);
    _mm_storeu_si128((__m128i *)(d + 32), h2);
    _mm_storeu_si128((__m128i *)(d + 48), h3);
    _mm_storeu_si128((__m128i *)last, t0);
    _mm_storeu_si128((__m128i *)(last + 16), t1);
    _mm_storeu_si128((__m128i *)(last + 32), t2);
    _mm_storeu_si128((__m128i *)(last + 48), t3);
}

/* The same from the end down: aligned 64-byte blocks below the last
 * 64-byte boundary of dst, while they stay above the head. */
static inline void cma_copy_sse2_bwd(void *dst, const void *src, size_t len)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (len < 64) {
        memcpy(d, s, len);
        return;
    }
    uint8_t *last = d + len - 64;
    const uint8_t *sl = s + len - 64;
    __m128i h0 = _mm_loadu_si128((const __m128i *)s);
    __m128i h1 = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i h2 = _mm_loadu_si128((const __m128i *)(s + 32));
    __m128i h3 = _mm_loadu_si128((const __m128i *)(s + 48));
    __m128i t0 = _mm_loadu_si128((const __m128i *)sl);
    __m128i t1 = _mm_loadu_si128((const __m128i *)(sl + 16));
    __m128i t2 = _mm_loadu_si128((const __m128i *)(sl + 32));
    __m128i t3 = _mm_loadu_si128((const __m128i *)(sl + 48));
    uint8_t *end = d + len;
    uint8_t *p = end - ((uintptr_t)end & 63);
    const uint8_t *q = s + (p - d);
    for (; p - d > 64; p -= 64, q -= 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)(q - 16));
        __m128i x1 = _mm_loadu_si128((const __m128i *)(q - 32));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(q - 48));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(q - 64));
        _mm_store_si128((__m128i *)(p - 16), x0);
        _mm_store_si128((__m128i *)(p - 32), x1);
        _mm_store_si128((__m128i *)(p - 48), x2);
        _mm_store_si128((__m128i *)(p - 64), x3);
    }
    _mm_storeu_si128((__m128i *)last, t0);
    _mm_storeu_si128((__m128i *)(last + 16), t1);
    _mm_storeu_si128((__m128i *)(last + 32), t2);
    _mm_storeu_si128((__m128i *)(last + 48), t3);
    _mm_storeu_si128((__m128i *)d, h0);
    _mm_storeu_si128((__m128i *)(d + 16), h1);
    _mm_storeu_si128((__m128i *)(d + 32), h2);
    _mm_storeu_si128((__m128i *)(d + 48), h3);
}

/* 32-byte vectors, 128 bytes per iteration; only called where the CPU
 * (and the OS) support AVX2. */
__attribute__((target("avx2"))) static inline void
cma_copy_avx2(void *dst, const void *src, size_t len)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (len < 64) {
        memcpy(d, s, len);
        return;
    }
    uint8_t *last = d + len - 64;
    const uint8_t *sl = s + len - 64;
    __m256i h0 = _mm256_loadu_si256((const __m256i *)s);
    __m256i h1 = _mm256_loadu_si256((const __m256i *)(s + 32));
    __m256i t0 = _mm256_loadu_si256((const __m256i *)sl);
    __m256i t1 = _mm256_loadu_si256((const __m256i *)(sl + 32));
    size_t k = 64 - ((uintptr_t)d & 63);
    uint8_t *p = d + k;
    const uint8_t *q = s + k;
    for (; last - p > 64; p += 128, q += 128) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)q);
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(q + 32));
        __m256i x2 = _mm256_loadu_si256((const __m256i *)(q + 64));
        __m256i x3 = _mm256_loadu_si256((const __m256i *)(q + 96));
        _mm256_store_si256((__m256i *)p, x0);
        _mm256_store_si256((__m256i *)(p + 32), x1);
        _mm256_store_si256((__m256i *)(p + 64), x2);
        _mm256_store_si256((__m256i *)(p + 96), x3);
    }
    if (p < last) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)q);
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(q + 32));
        _mm256_store_si256((__m256i *)p, x0);
        _mm256_store_si256((__m256i *)(p + 32), x1);
    }
    _mm256_storeu_si256((__m256i *)d, h0);
    _mm256_storeu_si256((__m256i *)(d + 32), h1);
    _mm256_storeu_si256((__m256i *)last, t0);
    _mm256_storeu_si256((__m256i *)(last + 32), t1);
}

__attribute__((target("avx2"))) static inline void
cma_copy_avx2_bwd(void *dst, const void *src, size_t len)
{
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (len < 64) {
        memcpy(d, s, len);
        return;
    }
    uint8_t *last = d + len - 64;
    const uint8_t *sl = s + len - 64;
    __m256i h0 = _mm256_loadu_si256((const __m256i *)s);
    __m256i h1 = _mm256_loadu_si256((const __m256i *)(s + 32));
    __m256i t0 = _mm256_loadu_si256((const __m256i *)sl);
    __m256i t1 = _mm256_loadu_si256((const __m256i *)(sl + 32));
    uint8_t *end = d + len;
    uint8_t *p = end - ((uintptr_t)end & 63);
    const uint8_t *q = s + (p - d);
    for (; p - d > 128; p -= 128, q -= 128) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(q - 32));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(q - 64));
        __m256i x2 = _mm256_loadu_si256((const __m256i *)(q - 96));
        __m256i x3 = _mm256_loadu_si256((const __m256i *)(q - 128));
        _mm256_store_si256((__m256i *)(p - 32), x0);
        _mm256_store_si256((__m256i *)(p - 64), x1);
        _mm256_store_si256((__m256i *)(p - 96), x2);
        _mm256_store_si256((__m256i *)(p - 128), x3);
    }
    if (p - d > 64) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(q - 32));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(q - 64));
        _mm256_store_si256((__m256i *)(p - 32), x0);
        _mm256_store_si256((__m256i *)(p - 64), x1);
    }
    _mm256_storeu_si256((__m256i *)last, t0);
    _mm256_storeu_si256((__m256i *)(last + 32), t1);
    _mm256_storeu_si256((__m256i *)d, h0);
    _mm256_storeu_si256((__m256i *)(d + 32), h1);
}

static inline int cma_copy_have_avx2(void)
{
    return __builtin_cpu_supports("avx2");
}

#endif /* __x86_64__ */

/* Copy `len` bytes from `src` to `dst` (not overlapping), as memcpy. */
static inline void cma_copy(void *dst, const void *src, size_t len)
{
#if defined(__x86_64__)
    uintptr_t delta = (uintptr_t)dst - (uintptr_t)src;
    if (len >= CMA_COPY_MIN && (delta & 63) != 0) {
        int bwd = (delta & 4095) < CMA_COPY_BACKWARD_WITHIN;
        if (cma_copy_have_avx2()) {
            (bwd ? cma_copy_avx2_bwd : cma_copy_avx2)(dst, src, len);
        } else {
            (bwd ? cma_copy_sse2_bwd : cma_copy_sse2)(dst, src, len);
        }
        return;
    }
#endif
    memcpy(dst, src, len);
}

#endif
