#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "util.h"

static uint64_t clock_us(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

uint64_t util_now_us(void)
{
	return clock_us(CLOCK_MONOTONIC);
}

uint64_t util_now_ms(void)
{
	return clock_us(CLOCK_MONOTONIC) / 1000u;
}

uint64_t util_wall_us(void)
{
	return clock_us(CLOCK_REALTIME);
}

static uint64_t rand_state;

int util_random(void *buf, size_t len)
{
	uint8_t *p = buf;

	while (len) {
		ssize_t n = getrandom(p, len, 0);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

uint64_t util_rand64(void)
{
	/* xorshift64*: jitter needs spread, not secrecy (tokens and keys come from util_random). */
	if (!rand_state) {
		if (getrandom(&rand_state, sizeof(rand_state), 0) != sizeof(rand_state) || !rand_state)
			rand_state = util_wall_us() | 1;
	}
	rand_state ^= rand_state >> 12;
	rand_state ^= rand_state << 25;
	rand_state ^= rand_state >> 27;
	return rand_state * 2685821657736338717ull;
}

uint64_t util_rand_below(uint64_t bound)
{
	return bound ? util_rand64() % bound : 0;
}

int util_addr_bytes(const char *host, uint8_t out[16])
{
	struct in_addr a4;

	if (inet_pton(AF_INET, host, &a4) == 1) {
		memset(out, 0, 10);
		out[10] = out[11] = 0xff;
		memcpy(out + 12, &a4, 4);
		return 0;
	}
	return inet_pton(AF_INET6, host, out) == 1 ? 0 : -EINVAL;
}

int util_addr_same_host(const char *peer, const char *addr)
{
	uint8_t a[16], b[16];
	char host[64];
	const char *colon;

	if (util_addr_bytes(addr, b))
		return 0;
	if (!util_addr_bytes(peer, a))
		return !memcmp(a, b, 16);
	colon = strrchr(peer, ':'); /* "host:port": the port follows the last colon */
	if (!colon || (size_t)(colon - peer) >= sizeof(host))
		return 0;
	memcpy(host, peer, (size_t)(colon - peer));
	host[colon - peer] = '\0';
	return !util_addr_bytes(host, a) && !memcmp(a, b, 16);
}

size_t util_strlcpy(char *dst, const char *src, size_t size)
{
	size_t n = strlen(src);

	if (size) {
		size_t c = n < size - 1 ? n : size - 1;

		memcpy(dst, src, c);
		dst[c] = '\0';
	}
	return n;
}

int util_addr_ifname(const char *addr, char *name, size_t len)
{
	unsigned char want[16];
	struct ifaddrs *ifs, *i;
	int family, ret = -ENODEV;
	size_t alen;

	if (inet_pton(AF_INET, addr, want) == 1) {
		family = AF_INET;
		alen = 4;
	} else if (inet_pton(AF_INET6, addr, want) == 1) {
		family = AF_INET6;
		alen = 16;
	} else {
		return -EINVAL;
	}
	if (getifaddrs(&ifs))
		return -errno;
	for (i = ifs; i; i = i->ifa_next) {
		const void *have;

		if (!i->ifa_addr || i->ifa_addr->sa_family != family)
			continue;
		have = family == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
					 : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
		if (!memcmp(have, want, alen)) {
			util_strlcpy(name, i->ifa_name, len);
			ret = 0;
			break;
		}
	}
	freeifaddrs(ifs);
	if (ret && family == AF_INET && want[0] == 127) {
		util_strlcpy(name, "lo", len); /* all of 127/8 is the loopback's */
		ret = 0;
	}
	return ret;
}

int util_parse_bytes(const char *s, uint64_t *out)
{
	static const char units[] = "KMGT";
	uint64_t v = 0;
	const char *u;
	unsigned shift = 0;

	if (!s || *s < '0' || *s > '9')
		return -EINVAL;
	for (; *s >= '0' && *s <= '9'; s++) {
		if (v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
			return -EINVAL;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	if (*s) {
		u = strchr(units, *s);
		if (!u || s[1])
			return -EINVAL;
		shift = 10u * (unsigned)(u - units + 1);
		if (v > UINT64_MAX >> shift)
			return -EINVAL;
	}
	*out = v << shift;
	return 0;
}

int util_mutex_init_pi(pthread_mutex_t *m)
{
	pthread_mutexattr_t at;
	int ret;

	if (pthread_mutexattr_init(&at))
		return pthread_mutex_init(m, NULL);
	if (pthread_mutexattr_setprotocol(&at, PTHREAD_PRIO_INHERIT)) {
		pthread_mutexattr_destroy(&at);
		return pthread_mutex_init(m, NULL);
	}
	ret = pthread_mutex_init(m, &at);
	pthread_mutexattr_destroy(&at);
	return ret ? pthread_mutex_init(m, NULL) : 0;
}

int util_dl_load(const char *soname, const char *const *names, void **fns, size_t n, char *err, size_t errlen)
{
	void *dl = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
	const char *e;

	if (!dl) {
		e = dlerror();
		snprintf(err, errlen, "cannot load %s: %s", soname, e ? e : "dlopen failed");
		return -ENOENT;
	}
	for (size_t i = 0; i < n; i++) {
		dlerror();
		fns[i] = dlsym(dl, names[i]);
		if (!fns[i]) {
			e = dlerror();
			snprintf(err, errlen, "%s has no %s: %s", soname, names[i], e ? e : "dlsym failed");
			memset(fns, 0, n * sizeof(*fns)); /* none half resolved: callers test fns[] */
			return -ENOENT;
		}
	}
	return 0;
}

int util_fds_open(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	int n = -1; /* the directory's own descriptor is counted below */

	if (!d)
		return -errno;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}
