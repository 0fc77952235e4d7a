/*
 * A failed connect to the control socket, explained: the path, and for a permission the owner,
 * group and mode the socket has, so that a user outside its group learns which group to join.
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "sockerr.h"

static const char *user_name(uid_t uid, char *buf, size_t len)
{
	struct passwd pw, *res = NULL;
	char pwbuf[1024];

	if (!getpwuid_r(uid, &pw, pwbuf, sizeof(pwbuf), &res) && res)
		snprintf(buf, len, "%s", res->pw_name);
	else
		snprintf(buf, len, "%u", (unsigned)uid);
	return buf;
}

static const char *group_name(gid_t gid, char *buf, size_t len)
{
	struct group gr, *res = NULL;
	char grbuf[4096];

	if (!getgrgid_r(gid, &gr, grbuf, sizeof(grbuf), &res) && res)
		snprintf(buf, len, "%s", res->gr_name);
	else
		snprintf(buf, len, "%u", (unsigned)gid);
	return buf;
}

/* -EACCES: who may use the socket, from the file itself. */
static void explain_access(const char *path, char *out, size_t len)
{
	char user[64], group[64];
	struct stat st;

	if (stat(path, &st)) {
		snprintf(out, len, "no permission for %s: a directory on the way is closed to you (%s)", path,
			 strerror(errno));
		return;
	}
	user_name(st.st_uid, user, sizeof(user));
	group_name(st.st_gid, group, sizeof(group));
	if ((st.st_mode & 0060) == 0060)
		snprintf(out, len, "no permission for %s: join group %s (the socket is %s:%s %04o)", path, group, user,
			 group, (unsigned)(st.st_mode & 07777));
	else
		snprintf(out, len,
			 "no permission for %s: only %s may use it (the socket is %s:%s %04o; meshd's "
			 "cluster.socket_group opens it to a group)",
			 path, user, user, group, (unsigned)(st.st_mode & 07777));
}

void mesh_sock_explain(const char *path, int err, char *out, size_t len)
{
	switch (err) {
	case -ENOENT:
		snprintf(out, len, "meshd is not running at %s (no such socket)", path);
		break;
	case -ECONNREFUSED: {
		struct stat st;

		if (!stat(path, &st) && !S_ISSOCK(st.st_mode))
			snprintf(out, len, "%s is not a socket (meshd's is another path?)", path);
		else
			snprintf(out, len, "meshd is not running at %s (the socket is there, nobody answers on it)", path);
		break;
	}
	case -ENOTSOCK:
		snprintf(out, len, "%s is not a socket (meshd's is another path?)", path);
		break;
	case -EACCES:
	case -EPERM:
		explain_access(path, out, len);
		break;
	case -ETIMEDOUT:
		snprintf(out, len, "meshd at %s did not take the connection in time (busy or stuck)", path);
		break;
	case -ENAMETOOLONG:
		snprintf(out, len, "socket path %s is longer than %zu bytes", path,
			 sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		break;
	default:
		snprintf(out, len, "cannot connect to meshd at %s: %s", path, strerror(-err));
	}
}
