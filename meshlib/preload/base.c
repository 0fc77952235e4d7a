/*
 * The ground the rest of libmesh_preload stands on: the real libc functions (resolved once, by the
 * constructor or by the first call that comes before it), the switches from the environment
 * (MESH_PRELOAD, MESH_PRELOAD_PORTS, MESH_PRELOAD_DEBUG), the per-thread mark of a call inside
 * libmesh, warnings on stderr, a libmesh error as an errno, and the clock and spin of the waits.
 * It calls nothing else of the preload library.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "preload.h"

struct pl_real pl_real;
bool pl_debug_on;

static __thread int in_lib __attribute__((tls_model("initial-exec")));
static bool disabled;  /* MESH_PRELOAD=off */
static uint8_t *ports; /* MESH_PRELOAD_PORTS as a bitmap of 65536 bits, NULL: every port */

static void *next_sym(const char *name)
{
	void *f = dlsym(RTLD_NEXT, name);

	if (!f) {
		static const char msg[] = "libmesh_preload: a libc function is missing; cannot run\n";

		/* Not write(): that name is preload.c's interposer, above this file, and it needs
		 * pl_real.write, which may be the one not resolved yet. */
		if (syscall(SYS_write, 2, msg, sizeof(msg) - 1) < 0)
			_exit(127);
		_exit(127);
	}
	return f;
}

#define RESOLVE(name) pl_real.name = next_sym(#name)

static void parse_ports(const char *s)
{
	char *copy, *tok, *save = NULL;

	ports = calloc(65536 / 8, 1);
	copy = strdup(s);
	if (!ports || !copy) {
		free(ports);
		free(copy);
		ports = NULL;
		return;
	}
	for (tok = strtok_r(copy, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
		char *end;
		unsigned long v;

		errno = 0;
		v = strtoul(tok, &end, 10);
		if (errno || *end || v == 0 || v > 65535) {
			pl_warn(0, "MESH_PRELOAD_PORTS: '%s' is not a port 1..65535; ignored", tok);
			continue;
		}
		ports[v / 8] |= (uint8_t)(1u << (v % 8));
	}
	free(copy);
}

__attribute__((constructor)) static void pl_init(void)
{
	const char *v;

	RESOLVE(socket);
	RESOLVE(connect);
	RESOLVE(listen);
	RESOLVE(accept4);
	RESOLVE(close);
	RESOLVE(dup);
	RESOLVE(dup2);
	RESOLVE(dup3);
	RESOLVE(fcntl);
	RESOLVE(ioctl);
	RESOLVE(read);
	RESOLVE(write);
	RESOLVE(readv);
	RESOLVE(writev);
	RESOLVE(recvfrom);
	RESOLVE(sendto);
	RESOLVE(recvmsg);
	RESOLVE(sendmsg);
	RESOLVE(sendfile);
	RESOLVE(getsockopt);
	RESOLVE(setsockopt);
	RESOLVE(getsockname);
	RESOLVE(getpeername);
	RESOLVE(shutdown);
	RESOLVE(poll);
	RESOLVE(ppoll);
	RESOLVE(select);
	RESOLVE(pselect);
	RESOLVE(epoll_ctl);
	RESOLVE(epoll_wait);
	RESOLVE(epoll_pwait);
	RESOLVE(pread);
	v = getenv("MESH_PRELOAD");
	disabled = v && (!strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "no"));
	v = getenv("MESH_PRELOAD_DEBUG");
	pl_debug_on = v && *v && strcmp(v, "0");
	v = getenv("MESH_PRELOAD_PORTS");
	if (v && *v)
		parse_ports(v);
}

/* Before our constructor ran (another library's constructor calling read): resolve now. */
void pl_ensure_init(void)
{
	if (__builtin_expect(!pl_real.poll, 0))
		pl_init();
}

bool pl_bypass(void)
{
	pl_ensure_init();
	return disabled || in_lib;
}

void pl_lib_enter(void)
{
	in_lib++;
}

void pl_lib_leave(void)
{
	in_lib--;
}

bool pl_port_wanted(uint16_t port)
{
	return port && (!ports || (ports[port / 8] & (1u << (port % 8))));
}

void pl_warn(unsigned key, const char *fmt, ...)
{
	static _Atomic uint64_t seen[64];
	char buf[512];
	va_list ap;
	int n, saved = errno;

	if (key) {
		uint64_t bit = 1ull << (key % 64);

		if (atomic_fetch_or(&seen[(key / 64) % 64], bit) & bit)
			return;
	}
	n = snprintf(buf, sizeof(buf), "libmesh_preload[%d]: ", (int)getpid());
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 2)
		n = (int)sizeof(buf) - 2;
	buf[n++] = '\n';
	if (pl_real.write(2, buf, (size_t)n) < 0)
		errno = saved;
	errno = saved;
}

/* A libmesh error as an errno the application understands; the mesh's own codes become
 * ECONNRESET (named once on stderr). */
int pl_app_errno(int err)
{
	int e = -err;

	if (e > 0 && e < MESH_ERRNO_BASE)
		return e; /* a system errno as it is; the mesh's own codes are no errno a program knows */
	pl_warn((unsigned)e, "mesh error %d (%s), reported to the application as ECONNRESET", e,
		mesh_strerror(err));
	return ECONNRESET;
}

uint64_t pl_mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void pl_spin_start(struct pl_spin *s, uint32_t spin_us)
{
	s->now = spin_us ? pl_mono_us() : 0;
	s->until = spin_us ? s->now + spin_us : 0;
	s->looks = 1; /* the start read the clock */
}

bool pl_spin_on(struct pl_spin *s, int64_t deadline_ms)
{
	if (!s->until)
		return false;
	if (s->looks++ % PL_SPIN_LOOKS == 0)
		s->now = pl_mono_us();
	if (s->now >= s->until)
		s->until = 0; /* spent: no more spinning, and no more readings for it */
	else if (deadline_ms >= 0 && (int64_t)(s->now / 1000) >= deadline_ms)
		return false;
	return s->until != 0;
}
