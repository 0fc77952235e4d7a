#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
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
