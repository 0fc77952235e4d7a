/*
 * handoff: what passing a turn from one process to another costs on this machine. That cost is a
 * floor under every data path that crosses processes, so the channel benchmark prints it beside its
 * latency figures.
 *
 *   handoff [-n PROCS] [-l LAPS] [-m spin|yield|futex] [-T SECONDS] [-j]
 *
 * PROCS processes share one page and pass a token around a ring: process i waits until the token
 * names it, then names i + 1. One hop is one such pass. Two shapes matter:
 *   2 processes, one per CPU: perftest's shape (ib_write_lat: two busy pollers, no one else);
 *   4 processes on 2 CPUs: a channel's shape. A message goes application -> meshd -> (RDMA) ->
 *      peer meshd -> peer application, and the four share the CPUs, so a hop may have to wait until
 *      the scheduler gives the next process a CPU. Under TCG each switch also refills the emulated
 *      TLB, which makes the switch, not the work, the price of a hop.
 * The waiting styles (-m) are the ones of the product: "yield" polls with sched_yield between looks
 * (libmesh's spin and meshd's polling loop), "spin" polls without yielding (perftest), "futex"
 * sleeps until woken (an application or meshd that went to sleep).
 *
 * Output: one line, "N processes (MODE): X us per hop, Y us per lap", or with -j one JSON object
 * (procs, mode, laps, cpus, hop_us, lap_us). Exit status 0, 1 on bad arguments, 2 when the ring
 * could not run or did not finish within -T seconds (default 120): it never hangs.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PROCS_MAX 16

enum wait_mode { WAIT_SPIN, WAIT_YIELD, WAIT_FUTEX };

static const char *const mode_names[] = {"spin", "yield", "futex"};

static void usage(FILE *f)
{
	fprintf(f, "Usage: handoff [-n PROCS] [-l LAPS] [-m spin|yield|futex] [-T SECONDS] [-j]\n\n"
		   "PROCS processes (2..%d, default 2) pass a token around a ring LAPS times (default 1000)\n"
		   "and the time of one pass (a hop) is printed: the cost of handing work from one process\n"
		   "to another here, the floor under any data path that crosses processes.\n\n"
		   "  -m spin    poll without yielding (perftest's style)\n"
		   "  -m yield   poll with sched_yield between looks (libmesh's spin, meshd's polling; default)\n"
		   "  -m futex   sleep until woken (a sleeping application or meshd)\n"
		   "  -T SECONDS give up (exit 2) when the ring has not finished by then (default 120)\n"
		   "  -j         one JSON object instead of the sentence\n",
		PROCS_MAX);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void futex_wait(_Atomic uint32_t *w, uint32_t seen)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT, seen, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *w)
{
	syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static volatile sig_atomic_t timed_out;

static void on_alarm(int sig)
{
	(void)sig;
	timed_out = 1;
}

/* Waits until the token is want, then passes it on as want + 1; -1 when -T ran out first. */
static int take_and_pass(_Atomic uint32_t *tok, uint32_t want, enum wait_mode mode)
{
	uint32_t v;

	while ((v = atomic_load_explicit(tok, memory_order_acquire)) != want) {
		if (timed_out)
			return -1;
		if (mode == WAIT_YIELD)
			sched_yield();
		else if (mode == WAIT_FUTEX)
			futex_wait(tok, v);
	}
	atomic_store_explicit(tok, want + 1, memory_order_release);
	if (mode == WAIT_FUTEX)
		futex_wake_all(tok);
	return 0;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

int main(int argc, char **argv)
{
	long procs = 2, laps = 1000, timeout = 120;
	enum wait_mode mode = WAIT_YIELD;
	bool json = false;
	pid_t kids[PROCS_MAX];
	_Atomic uint32_t *tok;
	int c, nkids = 0, status = 0, ret = 2;
	uint64_t t0, t1;

	while ((c = getopt(argc, argv, "n:l:m:T:jh")) != -1) {
		switch (c) {
		case 'n':
			if (parse_long(optarg, 2, PROCS_MAX, &procs)) {
				fprintf(stderr, "handoff: -n %s: want 2..%d processes\n", optarg, PROCS_MAX);
				return 1;
			}
			break;
		case 'l':
			if (parse_long(optarg, 1, 10000000, &laps)) {
				fprintf(stderr, "handoff: -l %s: want 1..10000000 laps\n", optarg);
				return 1;
			}
			break;
		case 'm':
			for (c = 0; c < 3 && strcmp(optarg, mode_names[c]); c++)
				;
			if (c == 3) {
				fprintf(stderr, "handoff: -m %s: want spin, yield or futex\n", optarg);
				return 1;
			}
			mode = (enum wait_mode)c;
			break;
		case 'T':
			if (parse_long(optarg, 1, 86400, &timeout)) {
				fprintf(stderr, "handoff: -T %s: want 1..86400 seconds\n", optarg);
				return 1;
			}
			break;
		case 'j':
			json = true;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 1;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "handoff: unexpected argument '%s' (try -h)\n", argv[optind]);
		return 1;
	}
	tok = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (tok == MAP_FAILED) {
		perror("handoff: mmap");
		return 2;
	}
	/* The token counts hops; it must not wrap during the run. */
	atomic_store(tok, UINT32_MAX);
	for (long i = 1; i < procs; i++) {
		pid_t p = fork();

		if (p < 0) {
			perror("handoff: fork");
			goto out_kill;
		}
		if (p == 0) {
			/* A child never outlives the ring's parent (-T, a signal). */
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() == 1)
				_exit(2);
			for (long k = 0; k < laps; k++)
				take_and_pass(tok, (uint32_t)(k * procs + i), mode);
			_exit(0);
		}
		kids[nkids++] = p;
	}
	/* -T: SIGALRM stops the parent's wait (a futex wait returns EINTR); the children are killed. */
	sigaction(SIGALRM, &(struct sigaction){.sa_handler = on_alarm}, NULL); /* no SA_RESTART */
	alarm((unsigned)timeout);
	t0 = now_ns();
	/* Process 0 starts the first lap, then waits for the token to come round and passes it on. */
	atomic_store_explicit(tok, 1, memory_order_release);
	if (mode == WAIT_FUTEX)
		futex_wake_all(tok);
	for (long k = 0; k < laps; k++) {
		if (take_and_pass(tok, (uint32_t)((k + 1) * procs), mode)) {
			fprintf(stderr, "handoff: the ring did not finish %ld laps within %ld s (-T)\n", laps, timeout);
			goto out_kill;
		}
	}
	t1 = now_ns();
	alarm(0);
	ret = 0;
	for (int i = 0; i < nkids; i++) {
		if (waitpid(kids[i], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) {
			fprintf(stderr, "handoff: process %d of the ring failed\n", i + 1);
			ret = 2;
		}
	}
	nkids = 0;
	if (!ret) {
		double lap_us = (double)(t1 - t0) / 1e3 / (double)laps;
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);

		if (json)
			printf("{\"procs\": %ld, \"mode\": \"%s\", \"laps\": %ld, \"cpus\": %ld, \"hop_us\": %.3f, "
			       "\"lap_us\": %.3f}\n",
			       procs, mode_names[mode], laps, cpus, lap_us / (double)procs, lap_us);
		else
			printf("%ld processes (%s) on %ld CPUs: %.2f us per hop, %.2f us per lap\n", procs,
			       mode_names[mode], cpus, lap_us / (double)procs, lap_us);
	}
out_kill:
	for (int i = 0; i < nkids; i++) {
		kill(kids[i], SIGKILL);
		waitpid(kids[i], NULL, 0);
	}
	munmap((void *)tok, 4096);
	return ret;
}
