/*
 * meshd-keeper: keeps meshd's descriptors across its restarts where no systemd does (a container,
 * a test), speaking systemd's own protocol (docs/design.md, "Restarting meshd with channels kept").
 * It starts the program given after "--" with $NOTIFY_SOCKET naming a datagram socket of its own;
 * the program sends sd_notify(3) lines there: READY=1, STATUS=, STOPPING=1 are noted, FDSTORE=1 with
 * FDNAME= and descriptors (SCM_RIGHTS) keeps them in the store, FDSTOREREMOVE=1 with FDNAME= drops
 * them. When the program is killed, or exits with a status other than 0 after it said READY=1 (one
 * that refuses to start would refuse again), or on SIGUSR2 (a planned restart: SIGTERM to it first),
 * it is started again with the store passed on as systemd
 * does: descriptors from 3, LISTEN_FDS, LISTEN_FDNAMES, LISTEN_PID. SIGTERM and SIGINT stop it and
 * empty the store; SIGHUP goes to it. Only the program's own process may speak on the socket (its
 * credentials), the store has a bound, and a malformed datagram is said and dropped.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KEEP_FDS_MAX 4096      /* FileDescriptorStoreMax= */
#define KEEP_NAME_MAX 255      /* systemd's FDNAME length */
#define KEEP_MSG_MAX 4096      /* one notification's text */
#define KEEP_FDS_PER_MSG 253   /* SCM_MAX_FD */
#define KEEP_BURST 5           /* starts after failures within KEEP_BURST_S, then it gives up (StartLimitBurst=) */
#define KEEP_BURST_S 60
#define KEEP_RESTART_MS 100    /* RestartSec= after a failure; a planned restart starts at once */

struct kept {
	int fd;
	char name[KEEP_NAME_MAX + 1];
};

struct keeper {
	struct kept fds[KEEP_FDS_MAX];
	size_t n;
	int sock, sfd, epfd;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	pid_t child;
	char **argv;
	bool stopping, restart;
	bool ready; /* the running child said READY=1: it started, and a failure later is a crash */
	time_t starts[KEEP_BURST];
	unsigned n_starts;
};

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void say(const char *fmt, ...)
{
	va_list ap;

	fputs("meshd-keeper: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void usage(FILE *out)
{
	fprintf(out, "Usage: meshd-keeper [-s SOCKET] -- PROGRAM [ARG...]\n"
		     "\n"
		     "Runs PROGRAM (meshd) and keeps the descriptors it hands over with sd_notify's FDSTORE=1\n"
		     "across its restarts, as systemd does for a service with FileDescriptorStoreMax=: on a crash\n"
		     "or a status other than 0, and on SIGUSR2 (a planned restart), PROGRAM is started again with\n"
		     "them (LISTEN_FDS, LISTEN_FDNAMES). SIGTERM and SIGINT stop it and empty the store; SIGHUP is\n"
		     "passed on. Exits with PROGRAM's status.\n"
		     "\n"
		     "  -s, --socket PATH  the notification socket (default: an abstract one of this process)\n"
		     "  -h, --help         this help\n");
}

static int find_name(const struct keeper *k, const char *name)
{
	for (size_t i = 0; i < k->n; i++)
		if (!strcmp(k->fds[i].name, name))
			return (int)i;
	return -1;
}

static void drop_at(struct keeper *k, size_t i)
{
	close(k->fds[i].fd);
	k->fds[i] = k->fds[--k->n];
}

/* FDSTORE=1 with name: the descriptors join the store (a name may hold several, as in systemd). */
static void store(struct keeper *k, const char *name, const int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (k->n == KEEP_FDS_MAX) {
			say("the store holds %d descriptors already: %s dropped", KEEP_FDS_MAX, name);
			close(fds[i]);
			continue;
		}
		k->fds[k->n].fd = fds[i];
		snprintf(k->fds[k->n].name, sizeof(k->fds[k->n].name), "%s", name);
		k->n++;
	}
}

/* One notification: KEY=VALUE lines; fds came with it. Returns nothing: what is wrong is said. */
static void on_message(struct keeper *k, char *text, const int *fds, size_t nfds)
{
	const char *name = "stored";
	bool fdstore = false, remove = false;

	for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
		if (!strcmp(line, "READY=1"))
			k->ready = true;
		else if (!strcmp(line, "FDSTORE=1"))
			fdstore = true;
		else if (!strcmp(line, "FDSTOREREMOVE=1"))
			remove = true;
		else if (!strncmp(line, "FDNAME=", 7)) {
			name = line + 7;
			if (!*name || strlen(name) > KEEP_NAME_MAX || strchr(name, ':')) {
				say("a notification names descriptors \"%.40s\": not a valid FDNAME, dropped", name);
				fdstore = remove = false;
				break;
			}
		}
	}
	if (fdstore && !remove) {
		store(k, name, fds, nfds);
		return;
	}
	for (size_t i = 0; i < nfds; i++)
		close(fds[i]);
	if (remove)
		for (int i; (i = find_name(k, name)) >= 0;)
			drop_at(k, (size_t)i);
}

static void on_socket(struct keeper *k)
{
	char text[KEEP_MSG_MAX + 1];
	char cbuf[CMSG_SPACE(sizeof(int) * KEEP_FDS_PER_MSG) + CMSG_SPACE(sizeof(struct ucred))];
	struct iovec iov = {.iov_base = text, .iov_len = KEEP_MSG_MAX};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	int fds[KEEP_FDS_PER_MSG];
	struct ucred cred = {.pid = 0};
	size_t nfds = 0;
	ssize_t n = recvmsg(k->sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC | MSG_TRUNC);

	if (n < 0)
		return;
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			size_t m = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			memcpy(fds + nfds, CMSG_DATA(c), m * sizeof(int));
			nfds += m;
		} else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
			memcpy(&cred, CMSG_DATA(c), sizeof(cred));
		}
	}
	/* NotifyAccess=main: the program itself, nobody else who can reach the socket. */
	if (cred.pid != k->child || (size_t)n > KEEP_MSG_MAX || (mh.msg_flags & MSG_CTRUNC)) {
		say("a notification from pid %d (the program is %d), %zd bytes%s: dropped", (int)cred.pid, (int)k->child,
		    n, (mh.msg_flags & MSG_CTRUNC) ? ", descriptors cut" : "");
		for (size_t i = 0; i < nfds; i++)
			close(fds[i]);
		return;
	}
	text[n] = '\0';
	on_message(k, text, fds, nfds);
}

/* A start after a failure counts towards the burst limit, which ends a crash loop: false once
 * KEEP_BURST of them came within KEEP_BURST_S. */
static bool start_counted(struct keeper *k)
{
	time_t now = time(NULL);

	if (k->n_starts == KEEP_BURST && now - k->starts[0] < KEEP_BURST_S) {
		say("%d starts within %d s: giving up", KEEP_BURST, KEEP_BURST_S);
		return false;
	}
	if (k->n_starts == KEEP_BURST)
		memmove(k->starts, k->starts + 1, sizeof(k->starts[0]) * (KEEP_BURST - 1));
	else
		k->n_starts++;
	k->starts[k->n_starts - 1] = now;
	return true;
}

/* The program, with the store from descriptor 3 on, as systemd passes it. A planned restart (asked
 * for, the old one exited 0) is not counted: an operator upgrading, or a benchmark restarting it
 * often, is no crash loop. */
static int start(struct keeper *k, bool counted)
{
	pid_t pid;

	if (counted && !start_counted(k))
		return -1;
	pid = fork();
	if (pid < 0) {
		say("fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		char *names = malloc(k->n * (KEEP_NAME_MAX + 1) + 1), num[32];
		size_t off = 0;
		sigset_t none;

		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		/* Out of the way first: the store's descriptors may sit where they must go. */
		for (size_t i = 0; i < k->n; i++) {
			int fd = fcntl(k->fds[i].fd, F_DUPFD_CLOEXEC, 3 + (int)k->n);

			if (fd < 0 || !names)
				_exit(127);
			k->fds[i].fd = fd;
		}
		for (size_t i = 0; i < k->n; i++) {
			if (dup2(k->fds[i].fd, 3 + (int)i) < 0)
				_exit(127);
			off += (size_t)sprintf(names + off, "%s%s", i ? ":" : "", k->fds[i].name);
		}
		if (k->n && names) {
			snprintf(num, sizeof(num), "%zu", k->n);
			setenv("LISTEN_FDS", num, 1);
			setenv("LISTEN_FDNAMES", names, 1);
			snprintf(num, sizeof(num), "%d", (int)getpid());
			setenv("LISTEN_PID", num, 1);
		} else {
			unsetenv("LISTEN_FDS");
			unsetenv("LISTEN_FDNAMES");
			unsetenv("LISTEN_PID");
		}
		setenv("NOTIFY_SOCKET", k->path, 1);
		/* How many it keeps, as systemd 254 says FileDescriptorStoreMax= (meshd keeps channels
		 * only where a store is kept). */
		snprintf(num, sizeof(num), "%d", KEEP_FDS_MAX);
		setenv("FDSTORE", num, 1);
		execvp(k->argv[0], k->argv);
		fprintf(stderr, "meshd-keeper: %s: %s\n", k->argv[0], strerror(errno));
		_exit(127);
	}
	k->child = pid;
	k->ready = false;
	if (k->n)
		say("started %s (pid %d) with %zu kept descriptors", k->argv[0], (int)pid, k->n);
	return 0;
}

static int open_socket(struct keeper *k, const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	socklen_t len;
	int one = 1;

	k->sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (k->sock < 0)
		return -errno;
	if (path) {
		snprintf(k->path, sizeof(k->path), "%s", path);
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
		unlink(path);
		len = (socklen_t)sizeof(sa);
	} else {
		/* Abstract: nothing in the file system to clean up or to reach from outside the namespace. */
		snprintf(k->path, sizeof(k->path), "@meshd-keeper-%d", (int)getpid());
		snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1, "%s", k->path + 1);
		len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(k->path));
	}
	if (bind(k->sock, (struct sockaddr *)&sa, len) ||
	    setsockopt(k->sock, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)))
		return -errno;
	return 0;
}

int main(int argc, char **argv)
{
	static struct keeper k = {.sock = -1, .sfd = -1, .epfd = -1};
	const char *path = NULL;
	sigset_t set;
	int i = 1, status = 1;

	for (; i < argc && strcmp(argv[i], "--"); i++) {
		if ((!strcmp(argv[i], "-s") || !strcmp(argv[i], "--socket")) && i + 1 < argc) {
			path = argv[++i];
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else {
			usage(stderr);
			return 2;
		}
	}
	if (i + 1 >= argc) {
		usage(stderr);
		return 2;
	}
	k.argv = argv + i + 1;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGUSR2);
	sigaddset(&set, SIGCHLD);
	sigprocmask(SIG_BLOCK, &set, NULL);
	k.sfd = signalfd(-1, &set, SFD_CLOEXEC);
	k.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (k.sfd < 0 || k.epfd < 0 || open_socket(&k, path)) {
		say("cannot set up: %s", strerror(errno));
		return 1;
	}
	{
		struct epoll_event a = {.events = EPOLLIN, .data.fd = k.sfd}, b = {.events = EPOLLIN, .data.fd = k.sock};

		epoll_ctl(k.epfd, EPOLL_CTL_ADD, k.sfd, &a);
		epoll_ctl(k.epfd, EPOLL_CTL_ADD, k.sock, &b);
	}
	if (start(&k, true))
		return 1;
	for (;;) {
		struct epoll_event ev;
		struct signalfd_siginfo si;

		if (epoll_wait(k.epfd, &ev, 1, -1) <= 0)
			continue;
		if (ev.data.fd == k.sock) {
			on_socket(&k);
			continue;
		}
		if (read(k.sfd, &si, sizeof(si)) != sizeof(si))
			continue;
		if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
			k.stopping = true;
			kill(k.child, SIGTERM);
		} else if (si.ssi_signo == SIGHUP) {
			kill(k.child, SIGHUP);
		} else if (si.ssi_signo == SIGUSR2) {
			k.restart = true;
			kill(k.child, SIGTERM);
		} else if (si.ssi_signo == SIGCHLD) {
			int ws;
			pid_t pid;
			bool failed;

			while ((pid = waitpid(-1, &ws, WNOHANG)) > 0) {
				if (pid != k.child)
					continue;
				status = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
				failed = !WIFEXITED(ws) || WEXITSTATUS(ws);
				if (k.stopping || (!failed && !k.restart))
					goto out;
				if (failed && !k.ready && WIFEXITED(ws)) {
					/* It refused to start (a configuration it cannot use): another start
					 * would refuse again. */
					say("%s (pid %d) exited with %d before it was ready: not starting it again",
					    k.argv[0], (int)pid, WEXITSTATUS(ws));
					goto out;
				}
				say("%s (pid %d) %s %d: starting it again", k.argv[0], (int)pid,
				    WIFEXITED(ws) ? "exited with" : "was killed by signal",
				    WIFEXITED(ws) ? WEXITSTATUS(ws) : WTERMSIG(ws));
				/* The channels wait meanwhile: a planned restart loses no time; after a
				 * failure a short pause keeps a crash loop from spinning (the burst limit
				 * ends it). */
				if (failed)
					usleep(KEEP_RESTART_MS * 1000);
				k.restart = false;
				if (start(&k, failed))
					goto out;
			}
		}
	}
out:
	while (k.n)
		drop_at(&k, k.n - 1);
	if (path)
		unlink(path);
	return status;
}
