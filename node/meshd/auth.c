#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pwd.h>
#include <sys/types.h>

#include <nettle/base64.h>
#include <nettle/hmac.h>
#include <nettle/memops.h>

#include "auth.h"
#include "util.h"

#define AUTH_FILE_MAX 4096 /* a key file is a few lines */

static int auth_fail(char *err, size_t errlen, int ret, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int auth_fail(char *err, size_t errlen, int ret, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return ret;
}

/* The user name of uid, or its number when it has none. */
static const char *auth_user_name(uid_t uid, char *buf, size_t len)
{
	char pwbuf[1024];
	struct passwd pw, *res = NULL;

	if (!getpwuid_r(uid, &pw, pwbuf, sizeof(pwbuf), &res) && res)
		snprintf(buf, len, "%s", res->pw_name);
	else
		snprintf(buf, len, "%u", (unsigned)uid);
	return buf;
}

/* Only root or the user meshd runs as may own the key file: its owner can make it readable or put a
 * key of its own in it, and whoever holds the key is a node (an insider, docs/security.md). 0, or
 * -EPERM with what to do. */
static int auth_check_owner(const char *path, const struct stat *st, char *err, size_t errlen)
{
	uid_t us = geteuid();
	char owner[64], self[64];

	if (st->st_uid == 0 || st->st_uid == us)
		return 0;
	auth_user_name(st->st_uid, owner, sizeof(owner));
	auth_user_name(us, self, sizeof(self));
	return auth_fail(err, errlen, -EPERM,
			 "cluster.key_file %s: owned by user %s (uid %u), who could read it or put a key of their own "
			 "in it; it must belong to root or to the user meshd runs as, %s (uid %u): chown %s %s",
			 path, owner, (unsigned)st->st_uid, self, (unsigned)us, us ? self : "root", path);
}

/* One line of the file: base64 of exactly AUTH_KEY_LEN bytes. */
static int auth_parse_key(const char *line, size_t n, uint8_t key[AUTH_KEY_LEN])
{
	struct base64_decode_ctx b64;
	uint8_t out[BASE64_DECODE_LENGTH(AUTH_KEY_B64_LEN)];
	size_t got = 0;
	int ok;

	if (n != AUTH_KEY_B64_LEN || line[n - 1] != '=' || line[n - 2] == '=')
		return -EINVAL;
	for (size_t i = 0; i < n; i++) {
		char c = line[i];

		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/' ||
		      (c == '=' && i == n - 1)))
			return -EINVAL;
	}
	base64_decode_init(&b64);
	ok = base64_decode_update(&b64, &got, out, n, line) && base64_decode_final(&b64) && got == AUTH_KEY_LEN;
	if (ok)
		memcpy(key, out, AUTH_KEY_LEN);
	explicit_bzero(out, sizeof(out));
	explicit_bzero(&b64, sizeof(b64));
	return ok ? 0 : -EINVAL;
}

int auth_load_keys(const char *path, struct auth_keys *k, char *err, size_t errlen)
{
	char buf[AUTH_FILE_MAX + 1];
	struct stat st;
	ssize_t len;
	int fd, line = 0, ret = 0;

	memset(k, 0, sizeof(*k));
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return auth_fail(err, errlen, -errno, "cluster.key_file %s: cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st)) {
		ret = auth_fail(err, errlen, -errno, "cluster.key_file %s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = auth_fail(err, errlen, -EINVAL, "cluster.key_file %s: not a regular file", path);
		goto out;
	}
	if (st.st_mode & 077) {
		ret = auth_fail(err, errlen, -EPERM,
				"cluster.key_file %s: permissions %04o are too open: the cluster key must not be "
				"accessible by group or others (chmod 600 %s)",
				path, (unsigned)(st.st_mode & 07777), path);
		goto out;
	}
	ret = auth_check_owner(path, &st, err, errlen);
	if (ret)
		goto out;
	len = read(fd, buf, sizeof(buf));
	if (len < 0) {
		ret = auth_fail(err, errlen, -errno, "cluster.key_file %s: %s", path, strerror(errno));
		goto out;
	}
	if (len > AUTH_FILE_MAX) {
		ret = auth_fail(err, errlen, -EFBIG, "cluster.key_file %s: longer than %d bytes", path, AUTH_FILE_MAX);
		goto out;
	}
	buf[len] = '\0';
	for (char *p = buf, *nl; *p; p = nl) {
		size_t n;

		nl = strchr(p, '\n');
		nl = nl ? nl + 1 : p + strlen(p);
		line++;
		n = (size_t)(nl - p);
		while (n && (p[n - 1] == '\n' || p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t'))
			n--;
		while (n && (*p == ' ' || *p == '\t')) {
			p++;
			n--;
		}
		if (!n || *p == '#')
			continue;
		if (k->n == AUTH_KEYS_MAX) {
			ret = auth_fail(err, errlen, -EINVAL,
					"cluster.key_file %s:%d: a third key; the file holds the current key and at most "
					"the next one",
					path, line);
			goto out;
		}
		if (auth_parse_key(p, n, k->key[k->n])) {
			ret = auth_fail(err, errlen, -EINVAL,
					"cluster.key_file %s:%d: not a key (base64 of %d bytes, %d characters, as "
					"`meshctl keygen` prints: a shorter key is refused)",
					path, line, AUTH_KEY_LEN, AUTH_KEY_B64_LEN);
			goto out;
		}
		k->n++;
	}
	if (!k->n)
		ret = auth_fail(err, errlen, -EINVAL, "cluster.key_file %s: no key in it (`meshctl keygen > %s`)", path,
				path);
out:
	explicit_bzero(buf, sizeof(buf));
	if (ret)
		explicit_bzero(k, sizeof(*k));
	close(fd);
	return ret;
}

int auth_keygen(char *out, size_t len)
{
	uint8_t key[AUTH_KEY_LEN];
	int ret;

	if (len < AUTH_KEY_B64_LEN + 1)
		return -ENOSPC;
	ret = util_random(key, sizeof(key));
	if (ret)
		return ret;
	base64_encode_raw(out, AUTH_KEY_LEN, key);
	out[BASE64_ENCODE_RAW_LENGTH(AUTH_KEY_LEN)] = '\0';
	explicit_bzero(key, sizeof(key));
	return 0;
}

static void put_u64(uint8_t **p, uint64_t v)
{
	for (int i = 7; i >= 0; i--)
		*(*p)++ = (uint8_t)(v >> (8 * i));
}

/* The transcript as bytes: fixed-width, big-endian, the cluster name length-prefixed, so no two
 * transcripts encode alike. */
static size_t auth_encode(const struct auth_transcript *t, uint8_t *buf, size_t cap)
{
	static const char label[] = "rdmamesh-auth-v1";
	size_t name = strlen(t->cluster);
	uint8_t *p = buf;

	if (sizeof(label) + 8 + name + 1 + 4 * 8 + 2 * AUTH_NONCE_LEN > cap)
		return 0;
	memcpy(p, label, sizeof(label));
	p += sizeof(label);
	put_u64(&p, name);
	memcpy(p, t->cluster, name);
	p += name;
	*p++ = t->dialler_proves ? 'D' : 'A';
	put_u64(&p, t->dialler);
	put_u64(&p, t->acceptor);
	put_u64(&p, t->link_epoch);
	put_u64(&p, ((uint64_t)t->rail << 32) | t->gen);
	memcpy(p, t->nonce_dialler, AUTH_NONCE_LEN);
	p += AUTH_NONCE_LEN;
	memcpy(p, t->nonce_acceptor, AUTH_NONCE_LEN);
	p += AUTH_NONCE_LEN;
	return (size_t)(p - buf);
}

static int auth_mac(const uint8_t key[AUTH_KEY_LEN], const struct auth_transcript *t, uint8_t mac[AUTH_MAC_LEN])
{
	uint8_t buf[512];
	struct hmac_sha256_ctx ctx;
	size_t n = auth_encode(t, buf, sizeof(buf));

	if (!n)
		return -ENAMETOOLONG;
	hmac_sha256_set_key(&ctx, AUTH_KEY_LEN, key);
	hmac_sha256_update(&ctx, n, buf);
	hmac_sha256_digest(&ctx, AUTH_MAC_LEN, mac);
	explicit_bzero(&ctx, sizeof(ctx)); /* holds the key's inner and outer states */
	return 0;
}

int auth_prove(const struct auth_keys *k, const struct auth_transcript *t, uint8_t mac[AUTH_MAC_LEN])
{
	if (!k->n)
		return -ENOKEY;
	return auth_mac(k->key[0], t, mac);
}

bool auth_verify(const struct auth_keys *k, const struct auth_transcript *t, const uint8_t *mac, size_t mac_len)
{
	bool ok = false;

	if (mac_len != AUTH_MAC_LEN)
		return false;
	for (unsigned i = 0; i < k->n; i++) {
		uint8_t want[AUTH_MAC_LEN];

		/* Every key is tried: the time does not say which one matched. */
		if (!auth_mac(k->key[i], t, want) && memeql_sec(want, mac, AUTH_MAC_LEN))
			ok = true;
		explicit_bzero(want, sizeof(want));
	}
	return ok;
}
