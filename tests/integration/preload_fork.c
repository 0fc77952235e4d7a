/*
 * TCP echo servers that fork and thread the ways real servers do, for the preload test
 * (tests/integration/preload_test.py --part fork runs them under LD_PRELOAD=libmesh_preload.so,
 * with preload_echo's clients). Nothing here knows the mesh.
 *
 *   preload_fork prefork PORT NPROC PER
 *        listen, then fork NPROC workers that share the listener (made non-blocking): each waits in
 *        poll and takes PER connections with accept4(SOCK_NONBLOCK), tolerating EAGAIN (another
 *        worker took it), echoes each until EOF and exits; the parent waits for them (nginx).
 *   preload_fork threads PORT NTHREADS PER
 *        the same with NTHREADS threads of one process (memcached's and many servers' way).
 *   preload_fork perconn PORT COUNT
 *        a blocking accept in the parent, a child forked per connection that echoes it until EOF;
 *        the parent closes its copy at once and takes the next (socat fork, inetd, sshd).
 *   preload_fork daemon PORT COUNT PIDFILE
 *        listen, fork and let the parent exit (a daemon), fork again a worker that echoes COUNT
 *        connections one after the other; the middle process exits with its worker's status after
 *        writing "ok" or "fail" to PIDFILE.done (memcached -d, nginx's daemon on).
 *   preload_fork bgsave PORT
 *        one connection, echoed until EOF; after the first message a child is forked that holds
 *        the connection without touching it and exits, and one that closes its copy and exits
 *        (redis's BGSAVE with clients connected): the parent's echo goes on unharmed.
 *   preload_fork steal PORT
 *        one connection: a child forked after the first echo serves the rest (its first use makes
 *        the connection its own); the parent, still holding its copy, checks that a read there
 *        fails with ENOTCONN (one process at a time uses a channel) and leaves it to the child.
 *        Over kernel TCP (no mesh) the parent's read would compete for the bytes: it is skipped
 *        when MESH_FORK_KERNEL=1.
 * Every process prints "accepted pid N" for each connection it takes. Exit status 0 when every
 * check held; each failure is named on stderr.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                  \
	do {                                                              \
		if (!(cond)) {                                            \
			fprintf(stderr, "preload_fork[%d]: FAIL: ", (int)getpid()); \
			fprintf(stderr, __VA_ARGS__);                     \
			fprintf(stderr, " (%s)\n", strerror(errno));      \
			failures++;                                       \
		}                                                         \
	} while (0)

static int listen_on(int port)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 64)) {
		perror("preload_fork: listen");
		exit(2);
	}
	return fd;
}

/* Writes all of buf, as a blocking socket does (a partial count is taken as the kernel gives it). */
static bool write_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t w = write(fd, buf, len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return false;
		buf += w;
		len -= (size_t)w;
	}
	return true;
}

/* Echoes one blocking connection until EOF; max: stop after the first read (0: none). */
static bool echo(int fd, bool first_only)
{
	static __thread char buf[1 << 16];
	ssize_t n;

	while ((n = read(fd, buf, sizeof(buf))) != 0) {
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || !write_all(fd, buf, (size_t)n)) {
			CHECK(0, "echo on descriptor %d", fd);
			return false;
		}
		if (first_only)
			return true;
	}
	return true;
}

static void accepted(void)
{
	printf("accepted pid %d\n", (int)getpid());
	fflush(stdout);
}

/* Takes count connections from a non-blocking listener shared with other workers. */
static void worker(int lfd, int count)
{
	int eagain = 0;

	for (int got = 0; got < count;) {
		struct pollfd pf = {.fd = lfd, .events = POLLIN};
		int fd, fl;

		if (poll(&pf, 1, 60000) <= 0) {
			CHECK(0, "a connection within 60 s (%d of %d taken)", got, count);
			return;
		}
		fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			eagain++; /* another worker took it */
			continue;
		}
		if (fd < 0) {
			CHECK(0, "accept4(SOCK_NONBLOCK)");
			return;
		}
		fl = fcntl(fd, F_GETFL);
		CHECK(fl >= 0 && (fl & O_NONBLOCK), "accept4(SOCK_NONBLOCK) gives a non-blocking socket");
		CHECK(fcntl(fd, F_GETFD) == FD_CLOEXEC, "accept4(SOCK_CLOEXEC) gives a close-on-exec socket");
		CHECK(fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0, "fcntl clears O_NONBLOCK");
		accepted();
		echo(fd, false);
		close(fd);
		got++;
	}
	printf("pid %d: %d connections, %d EAGAIN\n", (int)getpid(), count, eagain);
	fflush(stdout);
}

static int nonblocking_listener(int port)
{
	int lfd = listen_on(port);

	if (fcntl(lfd, F_SETFL, fcntl(lfd, F_GETFL) | O_NONBLOCK)) {
		perror("preload_fork: fcntl");
		exit(2);
	}
	return lfd;
}

/* fork(), with the child bounded as main bounds the parent (alarms are not inherited). */
static pid_t fork_bounded(void)
{
	pid_t pid = fork();

	if (!pid)
		alarm(120);
	return pid;
}

/* Waits for every child; false when one failed. */
static bool reap(int n)
{
	bool ok = true;

	for (int i = 0; i < n; i++) {
		int st;

		if (wait(&st) < 0) {
			CHECK(0, "wait");
			return false;
		}
		ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
	}
	return ok;
}

static int prefork(int port, int nproc, int per)
{
	int lfd = nonblocking_listener(port);

	for (int i = 0; i < nproc; i++) {
		pid_t pid = fork_bounded();

		if (pid < 0) {
			CHECK(0, "fork");
			return 1;
		}
		if (!pid) {
			worker(lfd, per);
			exit(failures ? 1 : 0);
		}
	}
	CHECK(reap(nproc), "every worker took its connections and exited 0");
	close(lfd);
	return failures ? 1 : 0;
}

struct thread_arg {
	int lfd, per;
};

static void *thread_main(void *arg)
{
	struct thread_arg *a = arg;

	worker(a->lfd, a->per);
	return NULL;
}

static int threads(int port, int n, int per)
{
	struct thread_arg a = {.lfd = nonblocking_listener(port), .per = per};
	pthread_t t[16];

	if (n > 16)
		n = 16;
	for (int i = 0; i < n; i++)
		if (pthread_create(&t[i], NULL, thread_main, &a)) {
			CHECK(0, "pthread_create");
			return 1;
		}
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	close(a.lfd);
	return failures ? 1 : 0;
}

static int perconn(int port, int count)
{
	int lfd = listen_on(port);

	for (int i = 0; i < count; i++) {
		int fd = accept(lfd, NULL, NULL);
		pid_t pid;

		if (fd < 0) {
			CHECK(0, "accept");
			return 1;
		}
		pid = fork_bounded();
		if (pid < 0) {
			CHECK(0, "fork");
			return 1;
		}
		if (!pid) {
			close(lfd);
			accepted();
			echo(fd, false);
			close(fd);
			exit(failures ? 1 : 0);
		}
		close(fd); /* the child's now */
	}
	CHECK(reap(count), "every child echoed its connection and exited 0");
	close(lfd);
	return failures ? 1 : 0;
}

static int daemonize(int port, int count, const char *pidfile)
{
	int lfd = listen_on(port);
	char done[512];
	pid_t pid = fork_bounded();
	FILE *f;
	bool ok;

	if (pid < 0) {
		CHECK(0, "fork");
		return 1;
	}
	if (pid)
		_exit(0); /* the daemon goes on in the child */
	setsid();
	pid = fork_bounded(); /* a second fork: the worker */
	if (pid < 0) {
		CHECK(0, "second fork");
		_exit(1);
	}
	if (!pid) {
		for (int i = 0; i < count; i++) {
			int fd = accept(lfd, NULL, NULL);

			if (fd < 0) {
				CHECK(0, "accept in the worker");
				exit(1);
			}
			accepted();
			echo(fd, false);
			close(fd);
		}
		exit(failures ? 1 : 0);
	}
	close(lfd);
	ok = reap(1);
	snprintf(done, sizeof(done), "%s.done", pidfile);
	f = fopen(done, "w");
	if (f) {
		fputs(ok ? "ok\n" : "fail\n", f);
		fclose(f);
	}
	return ok ? 0 : 1;
}

static int bgsave(int port)
{
	int lfd = listen_on(port);
	int fd = accept(lfd, NULL, NULL);
	pid_t pid;

	if (fd < 0) {
		CHECK(0, "accept");
		return 1;
	}
	accepted();
	close(lfd);
	CHECK(echo(fd, true), "the first message echoed");
	pid = fork_bounded(); /* holds the connection, never touches it, exits (as a BGSAVE child does) */
	if (!pid) {
		usleep(100000);
		_exit(0);
	}
	CHECK(pid > 0 && reap(1), "the holding child exited 0");
	pid = fork_bounded(); /* closes its copy: the parent's connection stays open */
	if (!pid) {
		close(fd);
		exit(0);
	}
	CHECK(pid > 0 && reap(1), "the closing child exited 0");
	CHECK(echo(fd, false), "the parent echoes the rest after its children came and went");
	close(fd);
	return failures ? 1 : 0;
}

static int steal(int port)
{
	int lfd = listen_on(port);
	int fd = accept(lfd, NULL, NULL), p[2];
	const char *kernel = getenv("MESH_FORK_KERNEL");
	pid_t pid;
	char c;

	if (fd < 0 || pipe(p)) {
		CHECK(0, "accept");
		return 1;
	}
	accepted();
	close(lfd);
	CHECK(echo(fd, true), "the first message echoed by the parent");
	pid = fork_bounded();
	if (!pid) {
		char buf[4096];
		ssize_t n = read(fd, buf, sizeof(buf)); /* the first use: the channel is the child's */

		close(p[0]);
		CHECK(n > 0 && write_all(fd, buf, (size_t)n), "the child's first read and echo");
		CHECK(write(p[1], "r", 1) == 1, "pipe");
		CHECK(echo(fd, false), "the child echoes the rest");
		exit(failures ? 1 : 0); /* without a close: the peer reads EOF all the same, as over TCP */
	}
	close(p[1]);
	CHECK(read(p[0], &c, 1) == 1, "the child said it read");
	if (!kernel || strcmp(kernel, "1")) {
		char buf[16];
		ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);

		CHECK(n < 0 && errno == ENOTCONN, "the parent's copy fails with ENOTCONN once the child uses it (%zd)", n);
	}
	close(fd);
	CHECK(reap(1), "the child echoed until EOF and exited 0");
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	alarm(120); /* never left behind: a server (or a daemon's worker) that waits for ever dies */
	if (argc == 5 && !strcmp(argv[1], "prefork"))
		return prefork(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	if (argc == 5 && !strcmp(argv[1], "threads"))
		return threads(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	if (argc == 4 && !strcmp(argv[1], "perconn"))
		return perconn(atoi(argv[2]), atoi(argv[3]));
	if (argc == 5 && !strcmp(argv[1], "daemon"))
		return daemonize(atoi(argv[2]), atoi(argv[3]), argv[4]);
	if (argc == 3 && !strcmp(argv[1], "bgsave"))
		return bgsave(atoi(argv[2]));
	if (argc == 3 && !strcmp(argv[1], "steal"))
		return steal(atoi(argv[2]));
	fprintf(stderr, "usage: preload_fork prefork|threads PORT N PER | perconn PORT COUNT | "
			"daemon PORT COUNT PIDFILE | bgsave PORT | steal PORT\n");
	return 2;
}
