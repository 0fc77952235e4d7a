/* Small shared internals of node/: clocks, randomness, bounded string copy. */
#ifndef MESH_UTIL_UTIL_H
#define MESH_UTIL_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* CLOCK_MONOTONIC in microseconds / milliseconds: all timers and RTTs. */
uint64_t util_now_us(void);
uint64_t util_now_ms(void);
/* CLOCK_REALTIME in microseconds: boot and link epochs, which must grow across restarts. */
uint64_t util_wall_us(void);

/* len bytes from getrandom(): every token, nonce and key a peer must not guess. 0 or -errno. */
int util_random(void *buf, size_t len);

/* Uniform in [0, bound) (bound > 0): xorshift64*, seeded from getrandom() on first use. For jitter
 * only: its state can be recovered from its output, so nothing secret comes from it. */
uint64_t util_rand_below(uint64_t bound);
uint64_t util_rand64(void);

/* The network interface that holds numeric address addr ("lo" for a loopback address, the first
 * interface for a wildcard), into name. 0, or -ENODEV when no interface has it. */
int util_addr_ifname(const char *addr, char *name, size_t len);

/* A numeric host into 16 bytes (IPv4 as IPv4-mapped IPv6); 0, or -EINVAL. */
int util_addr_bytes(const char *host, uint8_t out[16]);

/* Whether peer ("host" or "host:port", as transports name a connection's peer; an IPv4-mapped IPv6
 * host counts as its IPv4 address) is the numeric address addr. */
int util_addr_same_host(const char *peer, const char *addr);

/* Copies at most size-1 bytes and always terminates; returns strlen(src). */
size_t util_strlcpy(char *dst, const char *src, size_t size);
/* "4096", "64K", "16G": decimal digits with an optional binary suffix K, M, G or T. 0, or -EINVAL
 * for anything else (no sign, no space, no overflow). */
int util_parse_bytes(const char *s, uint64_t *out);

/* A mutex with priority inheritance (PTHREAD_PRIO_INHERIT), for locks the control-socket thread
 * (SCHED_FIFO) shares with normal threads: a holder preempted by the load would otherwise keep the
 * real-time waiter waiting for its turn on a CPU (docs/design.md, "Threads"). A plain mutex where
 * the system has no such protocol. 0 or a positive errno, as pthread_mutex_init. */
int util_mutex_init_pi(pthread_mutex_t *m);

/* Opens the shared library soname (RTLD_NOW | RTLD_LOCAL) and resolves n symbols names[i] into
 * fns[i]: for a library that only some configurations use, loaded when one does, so that every
 * other meshd neither maps it nor pays its loading at start. 0, or -ENOENT with err naming the
 * library and what dlopen or dlsym said and every fns[i] NULL (a library once loaded is never
 * closed, as a library's atexit handlers may run at exit). */
/* Descriptors this process has open now (/proc/self/fd), or a negative errno. */
int util_fds_open(void);
int util_dl_load(const char *soname, const char *const *names, void **fns, size_t n, char *err, size_t errlen);

#endif
