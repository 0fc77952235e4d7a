/*
 * Channels: the application's side of the shared-memory rings of proto/ring.h.
 *
 * Everything meshd wrote is hostile: the setup message and the control page are checked before the
 * channel exists, and each index meshd publishes is read once (acquire) into a local, checked
 * against its window and only then used; a value outside its window makes the channel fail with a
 * sticky -EPROTO, so no copy can reach outside the mapping. Our own indices are kept here and never
 * read back from the page.
 *
 * Waiting: set MESH_APP_WAITING, re-check, sleep in poll() on the wake eventfd and the lifeline (a
 * hang-up there means meshd is gone: -ECONNRESET instead of a hang), clear the eventfd, clear the
 * flag, re-check. Once mesh_channel_fd was called the flag stays set, so meshd wakes the fd it
 * returned on every change.
 *
 * Spinning: before it sleeps, a blocking call polls the ring for spin_us (meshd's hint in the control
 * page, or MESH_SPIN_US), yielding the CPU between looks so that a spinner never starves meshd or the
 * peer application on a busy machine; only every 64th look while our own QP carries the channel
 * (no meshd on that path to starve; a yield per look was a tenth of a 64 B round trip in the VM).
 * Kicks are skipped while meshd says it polls the ring (MESH_DAEMON_POLLING, see proto/ring.h for
 * why no publication can be missed).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "wire.h"

/* One step of a call that may wait: a result (>= 0 or an error), or -EAGAIN to wait and retry. */
typedef ssize_t (*chan_step_fn)(mesh_channel_t *c, void *arg);

/* ---- setup ---- */

/* A descriptor meshd passed as an eventfd really is one, where /proc tells (otherwise trusted). */
static bool fd_is_eventfd(int fd)
{
	char path[64], buf[512];
	ssize_t n;
	int f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	f = open(path, O_RDONLY | O_CLOEXEC);
	if (f < 0)
		return true;
	n = read(f, buf, sizeof(buf) - 1);
	close(f);
	if (n <= 0)
		return true;
	buf[n] = '\0';
	return strstr(buf, "eventfd-count:") != NULL;
}

static int setup_check(const ChannelSetup *s, const int *fds)
{
	struct stat st;
	int seals;

	if (!mesh_ring_size_valid(s->ring_size) || s->memfd_size != MESH_RING_CTRL_SIZE + 2 * s->ring_size) {
		lib_debug("channel %u: setup ring_size %" PRIu64 " memfd_size %" PRIu64 ": not a valid ring and layout",
			  s->channel_id, s->ring_size, s->memfd_size);
		return -EPROTO;
	}
	if (s->local_port > 65535 || s->peer_port > 65535 || s->peer_node > MESH_NODE_ID_MAX ||
	    s->qps > MESH_QPS_PER_LINK_MAX) {
		lib_debug("channel %u: setup port, node or qps out of range", s->channel_id);
		return -EPROTO;
	}
	if (fstat(fds[CTL_FD_MEMFD], &st) || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != s->memfd_size) {
		lib_debug("channel %u: memfd is not a file of memfd_size %" PRIu64 " bytes", s->channel_id,
			  s->memfd_size);
		return -EPROTO;
	}
	/* Sealed at its size, as meshd does: else whoever holds the memfd could shrink it under our
	 * mapping and turn the next access into SIGBUS. */
	seals = fcntl(fds[CTL_FD_MEMFD], F_GET_SEALS);
	if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
		lib_debug("channel %u: memfd is not sealed against shrinking and growing (seals %d)", s->channel_id,
			  seals);
		return -EPROTO;
	}
	if (fstat(fds[CTL_FD_LIFELINE], &st) || !S_ISSOCK(st.st_mode)) {
		lib_debug("channel %u: lifeline (descriptor 2) is not a socket", s->channel_id);
		return -EPROTO;
	}
	if (!fd_is_eventfd(fds[CTL_FD_KICK]) || !fd_is_eventfd(fds[CTL_FD_WAKE])) {
		lib_debug("channel %u: kick or wake (descriptors 3, 4) is not an eventfd", s->channel_id);
		return -EPROTO;
	}
	return 0;
}

/* The control page as meshd handed it over: line 0 describes the layout, the indices are in their
 * windows. Our copies of the indices start from it. */
static int ctrl_check(mesh_channel_t *c, uint32_t id)
{
	struct mesh_ring_ctrl *k = c->ctrl;
	uint64_t size = c->size;
	uint64_t tx_prod, tx_cons, rx_cons, rx_prod;

	if (k->magic != MESH_RING_MAGIC || k->version != MESH_RING_VERSION || k->ring_size != size ||
	    k->tx_off != MESH_RING_CTRL_SIZE || k->rx_off != MESH_RING_CTRL_SIZE + size) {
		lib_debug("channel %u: control page magic 0x%x version %u ring_size %" PRIu64 " tx_off %" PRIu64
			  " rx_off %" PRIu64 ": expected 0x%x %u %" PRIu64 " %u %" PRIu64,
			  id, k->magic, k->version, k->ring_size, k->tx_off, k->rx_off, MESH_RING_MAGIC,
			  MESH_RING_VERSION, size, MESH_RING_CTRL_SIZE, MESH_RING_CTRL_SIZE + size);
		return -EPROTO;
	}
	tx_prod = atomic_load_explicit(&k->tx_prod, memory_order_acquire);
	rx_cons = atomic_load_explicit(&k->rx_cons, memory_order_acquire);
	tx_cons = atomic_load_explicit(&k->tx_cons, memory_order_acquire);
	rx_prod = atomic_load_explicit(&k->rx_prod, memory_order_acquire);
	if (!mesh_ring_in_window(tx_prod, tx_cons, tx_cons + size) || tx_cons > UINT64_MAX - size ||
	    !mesh_ring_in_window(rx_prod, rx_cons, rx_cons + size) || rx_cons > UINT64_MAX - size) {
		lib_debug("channel %u: initial indices tx %" PRIu64 "/%" PRIu64 " rx %" PRIu64 "/%" PRIu64
			  " (cons/prod) outside their windows", id, tx_cons, tx_prod, rx_cons, rx_prod);
		return -EPROTO;
	}
	c->tx_prod = c->tx_shown = tx_prod;
	c->tx_cons = tx_cons;
	c->rx_cons = c->rx_kicked = rx_cons;
	c->rx_prod = c->rx_prod_d = rx_prod;
	return 0;
}

/* MESH_SPIN_US (a number of microseconds) wins over meshd's hint; both are capped. *from_env: the
 * environment decided (nothing raises the budget then). */
static uint32_t spin_budget(uint32_t hint, bool *from_env)
{
	const char *env = getenv("MESH_SPIN_US");
	unsigned long v = hint;

	*from_env = env && *env;
	if (*from_env) {
		char *end;

		errno = 0;
		v = strtoul(env, &end, 10);
		if (errno || *end) {
			lib_debug("MESH_SPIN_US=%s is not a number of microseconds; using meshd's %u", env, hint);
			v = hint;
		}
	}
	return (uint32_t)(v > MESH_SPIN_MAX_US ? MESH_SPIN_MAX_US : v);
}

int chan_create(const ChannelSetup *setup, uint32_t local_node, int fds[CTL_FDS_SETUP], mesh_channel_t **out)
{
	mesh_channel_t *c;
	int fl, ret;

	ret = setup_check(setup, fds);
	if (ret)
		goto err_close_fds;
	c = calloc(1, sizeof(*c));
	if (!c) {
		ret = -ENOMEM;
		goto err_close_fds;
	}
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->size = setup->ring_size;
	c->map_len = setup->memfd_size;
	c->map = mmap(NULL, c->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[CTL_FD_MEMFD], 0);
	if (c->map == MAP_FAILED) {
		ret = -errno;
		goto err_free;
	}
	c->ctrl = c->map;
	c->tx = (uint8_t *)c->map + MESH_RING_CTRL_SIZE;
	c->rx = c->tx + c->size;
	ret = ctrl_check(c, setup->channel_id);
	if (ret)
		goto err_unmap;
	/* Only we read the wake eventfd: never block in that read. */
	fl = fcntl(fds[CTL_FD_WAKE], F_GETFL);
	if (fl < 0 || fcntl(fds[CTL_FD_WAKE], F_SETFL, fl | O_NONBLOCK)) {
		ret = -errno;
		goto err_unmap;
	}
	/* The mapping keeps the memory; the descriptor is not needed any more. */
	close(fds[CTL_FD_MEMFD]);
	c->lifeline = fds[CTL_FD_LIFELINE];
	c->kick = fds[CTL_FD_KICK];
	c->wake = fds[CTL_FD_WAKE];
	c->epfd = -1;
	atomic_store_explicit(&c->ctrl->app_flags, 0, memory_order_release);
	c->spin_us = spin_budget(c->ctrl->spin_us, &c->spin_env);
	aq_open(c);
	c->info.channel_id = setup->channel_id;
	c->info.peer_node = setup->peer_node;
	c->info.local_port = (uint16_t)setup->local_port;
	c->info.peer_port = (uint16_t)setup->peer_port;
	c->info.qps = setup->qps;
	c->info.ring_size = setup->ring_size;
	c->info.local_node = local_node;
	*out = c;
	return 0;

err_unmap:
	munmap(c->map, c->map_len);
err_free:
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c);
err_close_fds:
	ctl_fds_close(fds, CTL_FDS_SETUP);
	return ret;
}

/* ---- the indices ---- */

/* meshd broke the ring contract: the channel is unusable from now on. */
static int chan_fail(mesh_channel_t *c, const char *index, uint64_t v, uint64_t lo, uint64_t hi)
{
	lib_debug("channel %u: %s %" PRIu64 " outside its window [%" PRIu64 ", %" PRIu64 "]", c->info.channel_id,
		  index, v, lo, hi);
	c->err = -EPROTO;
	return c->err;
}

/* meshd's tx_cons: tx_cons(previous) <= tx_cons <= tx_prod. */
static int tx_sync(mesh_channel_t *c)
{
	uint64_t v = atomic_load_explicit(&c->ctrl->tx_cons, memory_order_acquire);

	if (!mesh_ring_in_window(v, c->tx_cons, c->tx_prod))
		return chan_fail(c, "tx_cons", v, c->tx_cons, c->tx_prod);
	c->tx_cons = v;
	return 0;
}

/* meshd's rx_prod: it never goes back and stays within a ring of the reader (rx_cons may be ahead
 * of it, through a direct pair). Then the peer's direct pair (ring.h): taken when its check
 * matches and it is ahead of what we know, within a ring of the reader; anything else is not yet
 * usable (landing, stale after a resume, or from a peer that writes none) and is ignored. */
static int rx_sync(mesh_channel_t *c)
{
	uint64_t v = atomic_load_explicit(&c->ctrl->rx_prod, memory_order_acquire);

	if (!mesh_ring_in_window(v, c->rx_prod_d, c->rx_cons + c->size))
		return chan_fail(c, "rx_prod", v, c->rx_prod_d, c->rx_cons + c->size);
	c->rx_prod_d = v;
	if (v > c->rx_prod)
		c->rx_prod = v;
	if (mesh_ring_direct_read(c->ctrl, &v) && v > c->rx_prod && v <= c->rx_cons + c->size)
		c->rx_prod = v;
	/* Or the peer application's immediates, as our QP's CQ gave them (aq.c, checked there). */
	if (c->aq && (v = aq_rx_seen(c)) > c->rx_prod)
		c->rx_prod = v;
	return 0;
}

static uint32_t chan_state(const mesh_channel_t *c)
{
	return atomic_load_explicit(&c->ctrl->state, memory_order_acquire);
}

/* The error meshd reported with MESH_STATE_ERROR; anything but a negative errno is itself one. */
static int chan_state_error(const mesh_channel_t *c)
{
	int32_t e = atomic_load_explicit(&c->ctrl->error, memory_order_acquire);

	if (e < 0 && e > -4096)
		return e;
	lib_debug("channel %u: MESH_STATE_ERROR with error %d, not a negative errno", c->info.channel_id, e);
	return -EPROTO;
}

static void chan_kick(mesh_channel_t *c)
{
	uint64_t one = 1;

	/* Our index stores happened before; the fence orders them before the flag's load, and meshd
	 * fences between clearing the flag and its last look (proto/ring.h). */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&c->ctrl->daemon_flags, memory_order_relaxed) & MESH_DAEMON_POLLING)
		return;
	/* EAGAIN: the counter is saturated, meshd has a kick pending anyway. */
	if (write(c->kick, &one, sizeof(one)) < 0)
		return;
}

static void rx_publish(mesh_channel_t *c, uint64_t len)
{
	c->rx_cons += len;
	atomic_store_explicit(&c->ctrl->rx_cons, c->rx_cons, memory_order_release);
	/* meshd credits the sender per half ring, or quarter when it is short of room (ring.h; less
	 * never unblocks anyone). */
	if (c->rx_cons - c->rx_kicked >= mesh_ring_credit_step(c->size, c->rx_prod - c->rx_kicked)) {
		c->rx_kicked = c->rx_cons;
		chan_kick(c);
	}
}

static void tx_publish(mesh_channel_t *c, uint64_t len)
{
	c->tx_prod += len;
	c->answer_due = true;
	if (c->aq) {
		aq_progress_send(c);
		if (aq_owned(c))
			return; /* posted and published by aq_progress: meshd need not hear at once */
	}
	tx_show(c, c->tx_prod);
	chan_kick(c);
	/* meshd may have offered our half meanwhile, from before these bytes: look once more
	 * (chan_kick's fence orders our tx_prod before this look) and take it, which sends them now.
	 * Not looking would lose nothing (meshd, seeing them past the offer, withdraws it and posts
	 * them: ring.h MESH_AQ_CAP_TAKE), but it would cost a withdrawal and another grant. */
	if (c->aq)
		aq_progress_send(c);
}

/* ---- waiting ---- */

static void wake_clear(mesh_channel_t *c)
{
	uint64_t v;

	if (read(c->wake, &v, sizeof(v)) < 0)
		return; /* EAGAIN: nothing to clear */
}

/* Has meshd hung up the lifeline? Checked without waiting; sticky. */
static bool lifeline_gone(mesh_channel_t *c)
{
	struct pollfd p = {.fd = c->lifeline, .events = 0};

	if (!c->meshd_gone && poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL)))
		c->meshd_gone = true;
	return c->meshd_gone;
}

static bool fd_exported(const mesh_channel_t *c)
{
	return c->epfd >= 0;
}

/* Sleeps until meshd writes the wake eventfd or hangs up, with the lock held but released for the
 * poll itself (the other thread's steps go on meanwhile). 0 to re-check, or -EINTR / -errno. */
static int chan_sleep(mesh_channel_t *c, int aq_fd)
{
	struct pollfd p[3] = {{.fd = c->wake, .events = POLLIN}, {.fd = c->lifeline, .events = 0},
			      {.fd = aq_fd, .events = POLLIN}};
	int n;

	pthread_mutex_unlock(&c->lock);
	n = poll(p, aq_fd >= 0 ? 3 : 2, -1);
	pthread_mutex_lock(&c->lock);
	if (n < 0)
		return -errno;
	if (p[1].revents & (POLLHUP | POLLERR | POLLNVAL))
		c->meshd_gone = true;
	if (p[0].revents & POLLIN)
		wake_clear(c);
	if (aq_fd >= 0 && (p[2].revents & POLLIN))
		aq_event(c);
	return 0;
}

/* Before the last look of a caller that waits on the channel fd: whatever changes after the look
 * makes the fd readable again (meshd's wake, or our QP's next completion). Not while another
 * thread sleeps in chan_sleep: a wake cleared here, after its last look and before its poll,
 * would leave it asleep beside what it waits for; it clears the wake itself when it wakes. */
static void chan_arm(mesh_channel_t *c)
{
	if (c->sleeper)
		return;
	wake_clear(c);
	if (c->aq) {
		aq_event(c);
		aq_wait_fd(c);
	}
}

static uint64_t mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* How long a blocking call polls before it sleeps. With our own QP connected, the peer's answer
 * comes without any meshd on the way, a round trip of the two applications alone: polling for
 * one (MESH_AQ_SPIN_US) is cheaper than the sleep and the wake-up it saves (VM, 64 B ping-pong:
 * 104-123 us against 326-358 with meshd's default 50 us). MESH_SPIN_US still decides when set. */
#define MESH_AQ_SPIN_US 250u
/* Unless MESH_SPIN_US decides, a channel whose blocking waits last on average more than this many
 * spin budgets sleeps at once: a spinner that never catches its answer only takes CPU from the
 * ones that make it (the sender, the device's work in the kernel). A 64 B ping-pong's answers come
 * within the budget and keep it; a bulk echo's 64 KiB ones, milliseconds in the VM, do not. The
 * measured waits then include the wake-up, so the average comes down again when answers do. */
#define SPIN_LONG_WAITS 4u
static uint32_t chan_spin_us(const mesh_channel_t *c)
{
	uint32_t us = c->spin_us;

	if (c->spin_env)
		return us;
	if (us < MESH_AQ_SPIN_US && aq_connected(c))
		us = MESH_AQ_SPIN_US;
	return c->wait_us > SPIN_LONG_WAITS * us ? 0 : us;
}

/* A wait from since_us to now_us (both mono_us) goes into the average. */
static void chan_waited(mesh_channel_t *c, uint64_t since_us, uint64_t now_us)
{
	uint64_t w = now_us - since_us;

	if (w > UINT32_MAX / 8)
		w = UINT32_MAX / 8;
	c->wait_us = (uint32_t)((7ull * c->wait_us + w) / 8);
}

/* Looks between two readings of the clock while spinning on our own QP: where the clock source is
 * an emulated HPET (the Soft-RoCE VM) a reading is a system call of about 2 us, which a reading per
 * look would add to when a message is seen. */
#define SPIN_CLOCK_LOOKS 16u

/* Polls step for up to chan_spin_us from t0 (mono_us); -EAGAIN when the budget ran out. *now is
 * the clock as last read, at most SPIN_CLOCK_LOOKS looks old: the wait's end for its average, with
 * no reading of its own between a message seen and the caller having it. */
static ssize_t chan_spin(mesh_channel_t *c, chan_step_fn step, void *arg, bool rx, uint64_t t0, uint64_t *now)
{
	uint64_t until;
	ssize_t r;
	unsigned i = 0;
	bool gone;

	pthread_mutex_lock(&c->lock);
	until = t0 + chan_spin_us(c);
	pthread_mutex_unlock(&c->lock);

	*now = t0;
	for (;;) {
		bool own, due;

		pthread_mutex_lock(&c->lock);
		own = aq_connected(c);
		due = rx && c->answer_due && aq_look_is_syscall(c);
		pthread_mutex_unlock(&c->lock);

		/* Yield: the one we wait for (meshd, the peer) may need this very CPU; on our own QP
		 * only meshd's hand-offs (rare) and a peer on this CPU do, so yield seldom there (in
		 * the VM a yield is an emulated system call: one per look measured 26-27 us at 64 B
		 * against 22-24). But an answer to what we sent over our own TCP connection, where
		 * every look is a system call anyway, comes from a peer that may spin on this very
		 * CPU: the scheduler puts two such spinners on one CPU and keeps them there (both ran
		 * within its migration cost), and then each answer waited for a yield. On the host, 3
		 * runs of 20 (1000 round trips each) measured 10-15 us against 3 with a yield every 64
		 * looks; with one per look none did, and the others measured as before. Not for a
		 * reader of a stream: its yields gave a polling meshd the CPU (20-30% instead of 8%)
		 * and cost a fifth of a 64 KiB stream. A look that yields may give the CPU away for
		 * long: the clock is read after each. */
		if (!own || (i & 63) == 63 || due)
			sched_yield();
		pthread_mutex_lock(&c->lock);
		r = step(c, arg);
		gone = c->meshd_gone;
		pthread_mutex_unlock(&c->lock);
		if (r != -EAGAIN || gone)
			return r;
		i++;
		if ((!own || i % SPIN_CLOCK_LOOKS == 0) && (*now = mono_us()) >= until)
			return -EAGAIN;
	}
}

/* One blocking wait of chan_run, with the lock held: MESH_APP_WAITING for meshd, a last look and,
 * when it still finds nothing, a sleep. One waiting thread is the sleeper and polls the
 * descriptors (its QP's CQ armed before the last look); another one meanwhile waits on cond, from
 * its own last look (under the same lock) until the sleeper woke or gave the role up: a wake the
 * sleeper took may be the one it waits for, so it looks again. The flag stays set until the last
 * waiter leaves: one thread clearing it while the other sleeps lost that one's wake-ups. Returns
 * the look's result (-EAGAIN: look again), *err a poll's failure. */
static ssize_t chan_wait(mesh_channel_t *c, chan_step_fn step, void *arg, int *err)
{
	bool sleeper = !c->sleeper;
	uint64_t wakes = c->wakes;
	int aq_fd = -1;
	ssize_t r;

	*err = 0;
	if (!c->waiters++)
		atomic_fetch_or_explicit(&c->ctrl->app_flags, MESH_APP_WAITING, memory_order_seq_cst);
	atomic_thread_fence(memory_order_seq_cst);
	if (sleeper) {
		c->sleeper = true;
		aq_fd = c->aq ? aq_wait_fd(c) : -1; /* armed before the last look */
	}
	r = step(c, arg);
	if (r == -EAGAIN && sleeper) {
		*err = chan_sleep(c, aq_fd);
	} else if (r == -EAGAIN) {
		while (c->wakes == wakes && c->sleeper)
			pthread_cond_wait(&c->cond, &c->lock);
	}
	if (sleeper) {
		c->sleeper = false;
		c->wakes++;
		pthread_cond_broadcast(&c->cond);
	}
	if (!--c->waiters && !fd_exported(c))
		atomic_fetch_and_explicit(&c->ctrl->app_flags, ~MESH_APP_WAITING, memory_order_seq_cst);
	return r;
}

/* A call that must not wait, with the lock held: -EAGAIN, after the last look of a caller that
 * polls the channel fd, or what that look found. */
static ssize_t chan_nonblock(mesh_channel_t *c, chan_step_fn step, void *arg)
{
	ssize_t r;

	/* The caller polls the channel fd: clear it before the last look, so that it is readable
	 * again only for a change after that look. */
	if (fd_exported(c)) {
		chan_arm(c);
		r = step(c, arg);
		if (r != -EAGAIN)
			return r;
	}
	if (lifeline_gone(c)) {
		r = step(c, arg);
		return r != -EAGAIN ? r : -MESH_EMESHDGONE;
	}
	return -EAGAIN;
}

/* Runs step until it stops asking to wait. A blocking call sleeps between attempts; a
 * non-blocking one returns -EAGAIN. Once meshd is gone, a step that would wait gets
 * -MESH_EMESHDGONE (after whatever the ring still held). Every step under the lock (mesh.h,
 * Threads): a reader and a writer may run at once. */
static ssize_t chan_run(mesh_channel_t *c, int flags, chan_step_fn step, void *arg, bool rx)
{
	uint64_t t0 = 0; /* when this call began to wait */
	uint64_t now;
	ssize_t r;
	int err;

	pthread_mutex_lock(&c->lock);
	for (;;) {
		r = step(c, arg);
		if (r != -EAGAIN)
			break;
		if (c->meshd_gone) {
			r = -MESH_EMESHDGONE;
			break;
		}
		if (flags & MESH_NONBLOCK) {
			r = chan_nonblock(c, step, arg);
			pthread_mutex_unlock(&c->lock);
			return r;
		}
		if (!t0)
			t0 = mono_us();
		if (chan_spin_us(c)) {
			pthread_mutex_unlock(&c->lock);
			r = chan_spin(c, step, arg, rx, t0, &now);
			pthread_mutex_lock(&c->lock);
			if (r != -EAGAIN) {
				chan_waited(c, t0, now);
				pthread_mutex_unlock(&c->lock);
				return r;
			}
			if (c->meshd_gone) {
				r = -MESH_EMESHDGONE;
				break;
			}
		}
		r = chan_wait(c, step, arg, &err);
		if (r != -EAGAIN)
			break;
		if (err) {
			pthread_mutex_unlock(&c->lock);
			return err;
		}
	}
	if (t0 && r != -MESH_EMESHDGONE)
		chan_waited(c, t0, mono_us());
	pthread_mutex_unlock(&c->lock);
	return r;
}

/* A read: what it returns answers what we sent before it (an echo server releases the request
 * after it sent the answer; its next read waits for an answer all the same). */
static ssize_t chan_read(mesh_channel_t *c, int flags, chan_step_fn step, void *arg)
{
	ssize_t r = chan_run(c, flags, step, arg, true);

	if (r > 0) {
		pthread_mutex_lock(&c->lock);
		c->answer_due = false;
		pthread_mutex_unlock(&c->lock);
	}
	return r;
}

static int flags_check(int flags)
{
	return flags & ~MESH_NONBLOCK ? -EINVAL : 0;
}

/* ---- send ---- */

/* Free space in TX, or a reason not to send. */
static ssize_t tx_space(mesh_channel_t *c)
{
	int ret;

	if (c->err)
		return c->err;
	if (c->shut_wr)
		return -EPIPE;
	if (chan_state(c) & MESH_STATE_ERROR)
		return chan_state_error(c);
	if (c->aq)
		aq_progress_send(c);
	ret = tx_sync(c);
	if (ret)
		return ret;
	return (ssize_t)((c->aq ? aq_reusable(c, c->tx_cons) : c->tx_cons) + c->size - c->tx_prod);
}

struct send_arg {
	const uint8_t *buf;
	size_t len;
};

static ssize_t send_step(mesh_channel_t *c, void *arg)
{
	const struct send_arg *a = arg;
	ssize_t space = tx_space(c);
	uint64_t off, first;
	size_t n;

	if (space <= 0)
		return space ? space : -EAGAIN;
	n = a->len < (size_t)space ? a->len : (size_t)space;
	off = c->tx_prod & (c->size - 1);
	first = mesh_ring_contig(c->tx_prod, c->size);
	if (n <= first) {
		memcpy(c->tx + off, a->buf, n);
	} else {
		memcpy(c->tx + off, a->buf, first);
		memcpy(c->tx, a->buf + first, n - first);
	}
	tx_publish(c, n);
	return (ssize_t)n;
}

MESH_EXPORT ssize_t mesh_send(mesh_channel_t *c, const void *buf, size_t len, int flags)
{
	struct send_arg a = {.buf = buf, .len = len};

	if (!c || !buf || !len || flags_check(flags))
		return -EINVAL;
	c->reserved = 0; /* the copy lands where a reservation pointed */
	return chan_run(c, flags, send_step, &a, false);
}

static ssize_t reserve_step(mesh_channel_t *c, void *arg)
{
	void **buf = arg;
	ssize_t space = tx_space(c);
	uint64_t n;

	if (space <= 0)
		return space ? space : -EAGAIN;
	n = mesh_ring_contig(c->tx_prod, c->size);
	if (n > (uint64_t)space)
		n = (uint64_t)space;
	c->reserved = (size_t)n;
	*buf = c->tx + (c->tx_prod & (c->size - 1));
	return (ssize_t)n;
}

MESH_EXPORT ssize_t mesh_send_reserve(mesh_channel_t *c, void **buf, int flags)
{
	if (!c || !buf || flags_check(flags))
		return -EINVAL;
	c->reserved = 0;
	return chan_run(c, flags, reserve_step, buf, false);
}

static int send_commit(mesh_channel_t *c, size_t len)
{
	if (c->err)
		return c->err;
	if (c->shut_wr)
		return -EPIPE;
	if (len > c->reserved)
		return -EINVAL;
	c->reserved = 0;
	if (chan_state(c) & MESH_STATE_ERROR)
		return chan_state_error(c);
	tx_publish(c, len);
	return 0;
}

MESH_EXPORT int mesh_send_commit(mesh_channel_t *c, size_t len)
{
	int ret;

	if (!c || !len)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	ret = send_commit(c, len);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* ---- receive ---- */

/* Bytes readable in RX; 0 at EOF; or a reason there are none. The state is read before rx_prod:
 * meshd publishes rx_prod before MESH_STATE_PEER_EOF, so with EOF seen, rx_prod is final. Bytes
 * already in the ring come before the end of the stream and before an error. */
static ssize_t rx_avail(mesh_channel_t *c)
{
	uint32_t state;
	int ret;

	if (c->err)
		return c->err;
	if (c->aq)
		aq_progress(c);
	state = chan_state(c);
	ret = rx_sync(c);
	if (ret)
		return ret;
	if (c->rx_prod != c->rx_cons)
		return (ssize_t)(c->rx_prod - c->rx_cons);
	if (state & MESH_STATE_PEER_EOF)
		return 0;
	if (state & MESH_STATE_ERROR)
		return chan_state_error(c);
	return -EAGAIN;
}

struct recv_arg {
	uint8_t *buf;
	size_t len;
};

static ssize_t recv_step(mesh_channel_t *c, void *arg)
{
	const struct recv_arg *a = arg;
	ssize_t avail = rx_avail(c);
	uint64_t off, first;
	size_t n;

	if (avail <= 0)
		return avail;
	n = a->len < (size_t)avail ? a->len : (size_t)avail;
	off = c->rx_cons & (c->size - 1);
	first = mesh_ring_contig(c->rx_cons, c->size);
	if (n <= first) {
		memcpy(a->buf, c->rx + off, n);
	} else {
		memcpy(a->buf, c->rx + off, first);
		memcpy(a->buf + first, c->rx, n - first);
	}
	rx_publish(c, n);
	return (ssize_t)n;
}

MESH_EXPORT ssize_t mesh_recv(mesh_channel_t *c, void *buf, size_t len, int flags)
{
	struct recv_arg a = {.buf = buf, .len = len};

	if (!c || !buf || !len || flags_check(flags))
		return -EINVAL;
	c->peeked = 0; /* the copy consumes what a peek showed */
	return chan_read(c, flags, recv_step, &a);
}

static ssize_t peek_step(mesh_channel_t *c, void *arg)
{
	const void **buf = arg;
	ssize_t avail = rx_avail(c);
	uint64_t n;

	if (avail <= 0)
		return avail;
	n = mesh_ring_contig(c->rx_cons, c->size);
	if (n > (uint64_t)avail)
		n = (uint64_t)avail;
	c->peeked = (size_t)n;
	*buf = c->rx + (c->rx_cons & (c->size - 1));
	return (ssize_t)n;
}

MESH_EXPORT ssize_t mesh_recv_peek(mesh_channel_t *c, const void **buf, int flags)
{
	if (!c || !buf || flags_check(flags))
		return -EINVAL;
	c->peeked = 0;
	return chan_read(c, flags, peek_step, (void *)buf);
}

MESH_EXPORT int mesh_recv_release(mesh_channel_t *c, size_t len)
{
	int ret = 0;

	if (!c || !len)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	if (c->err) {
		ret = c->err;
	} else if (len > c->peeked) {
		ret = -EINVAL;
	} else {
		c->peeked = 0;
		rx_publish(c, len);
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* ---- the rest ---- */

/* Whether the channel has something the caller has not seen: what a receive would return without
 * waiting (bytes, EOF, an error), or space freed since its last look. Armed first, as before any
 * last look (our QP's CQ included). */
static bool chan_changed(mesh_channel_t *c)
{
	chan_arm(c);
	return rx_avail(c) != -EAGAIN ||
	       atomic_load_explicit(&c->ctrl->tx_cons, memory_order_acquire) != c->tx_cons;
}

static int channel_fd(mesh_channel_t *c);

MESH_EXPORT int mesh_channel_fd(mesh_channel_t *c)
{
	int ret;

	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	ret = channel_fd(c);
	pthread_mutex_unlock(&c->lock);
	return ret;
}

static int channel_fd(mesh_channel_t *c)
{
	struct epoll_event ev = {.events = EPOLLIN};
	int fd, ret;

	if (fd_exported(c))
		return c->epfd;
	/* The wake eventfd alone would never wake a poller whose meshd died: the fd given out is an
	 * epoll set of the wake eventfd and the lifeline (whose hang-up makes it readable). */
	fd = epoll_create1(EPOLL_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (epoll_ctl(fd, EPOLL_CTL_ADD, c->wake, &ev)) {
		ret = -errno;
		goto err_close_epoll;
	}
	ev.events = 0; /* EPOLLHUP and EPOLLERR are always reported */
	if (epoll_ctl(fd, EPOLL_CTL_ADD, c->lifeline, &ev)) {
		ret = -errno;
		goto err_close_epoll;
	}
	/* With a QP of our own, the peer's writes wake us through its completion channel (armed before
	 * each last look: chan_arm). */
	ev.events = EPOLLIN;
	if (aq_fd(c) >= 0 && epoll_ctl(fd, EPOLL_CTL_ADD, aq_fd(c), &ev)) {
		ret = -errno;
		goto err_close_epoll;
	}
	c->epfd = fd;
	/* From now on meshd writes the wake eventfd on every change. */
	atomic_fetch_or_explicit(&c->ctrl->app_flags, MESH_APP_WAITING, memory_order_seq_cst);
	/* A change meshd published between the caller's last look and the flag found it clear and woke
	 * no one (a consumer that first asked for the fd once it had sent and read everything waited
	 * for an EOF that had come: install_consumers). Look once more: what is there now makes the fd
	 * readable at once, as the wake would have. */
	if (chan_changed(c)) {
		uint64_t one = 1;

		if (write(c->wake, &one, sizeof(one)) < 0)
			lib_debug("channel %u: cannot wake our own fd: %s", c->info.channel_id, strerror(errno));
	}
	return fd;

err_close_epoll:
	close(fd);
	return ret;
}

MESH_EXPORT int mesh_channel_info(const mesh_channel_t *c, struct mesh_channel_info *info)
{
	if (!c || !info)
		return -EINVAL;
	*info = c->info;
	return 0;
}

MESH_EXPORT int mesh_shutdown(mesh_channel_t *c)
{
	if (!c)
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	if (!c->shut_wr) {
		c->shut_wr = true;
		c->reserved = 0;
		if (c->aq)
			aq_release(c); /* meshd sends the EOF after the bytes, so it must own them first */
		atomic_fetch_or_explicit(&c->ctrl->app_flags, MESH_APP_SHUT_WR, memory_order_release);
		chan_kick(c);
	}
	pthread_mutex_unlock(&c->lock);
	return 0;
}

MESH_EXPORT int mesh_close(mesh_channel_t *c)
{
	if (!c)
		return -EINVAL;
	mesh_shutdown(c);
	aq_close(c); /* before the unmap: its registrations cover the rings */
	munmap(c->map, c->map_len);
	if (c->epfd >= 0)
		close(c->epfd);
	close(c->kick);
	close(c->wake);
	/* Last: the lifeline's hang-up tells meshd the application is done with the channel. */
	close(c->lifeline);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c);
	return 0;
}

MESH_EXPORT int mesh_channel_detach(mesh_channel_t *c)
{
	if (!c)
		return -EINVAL;
	/* Nothing is written to the control page: the process that uses the channel may have moved
	 * its indices past our copy's. Our own sending path, if this process made it, only goes (its
	 * descriptors, its QP): that process, a forked copy of it, hands the half back at its first
	 * look (aq_mine), and the hand-back has meshd post again whatever the peer's reader lacks. */
	aq_close(c); /* before the unmap: its registrations cover the rings */
	munmap(c->map, c->map_len);
	if (c->epfd >= 0)
		close(c->epfd);
	close(c->kick);
	close(c->wake);
	close(c->lifeline); /* our copy: meshd hears when the last one goes */
	/* The lock is not destroyed: in a forked copy a thread that is not there may hold it. */
	free(c);
	return 0;
}

static void channel_status(mesh_channel_t *c, int flags, struct mesh_channel_status *st);

MESH_EXPORT int mesh_channel_status(mesh_channel_t *c, int flags, struct mesh_channel_status *st)
{
	if (!c || !st || (flags & ~(MESH_STATUS_ARM | MESH_STATUS_EDGE)) ||
	    (flags & MESH_STATUS_ARM && flags & MESH_STATUS_EDGE))
		return -EINVAL;
	pthread_mutex_lock(&c->lock);
	channel_status(c, flags, st);
	pthread_mutex_unlock(&c->lock);
	return 0;
}

static void channel_status(mesh_channel_t *c, int flags, struct mesh_channel_status *st)
{
	ssize_t rx, tx;

	memset(st, 0, sizeof(*st));
	st->spin_us = chan_spin_us(c);
	if (flags & MESH_STATUS_ARM) {
		/* Cleared before the look: a change after it makes the fd readable again. */
		if (fd_exported(c))
			chan_arm(c);
	}
	if (flags & (MESH_STATUS_ARM | MESH_STATUS_EDGE))
		lifeline_gone(c);
	rx = rx_avail(c);
	tx = tx_space(c);
	if (rx > 0) {
		st->rx_bytes = (uint64_t)rx;
		st->ready |= MESH_READY_RECV;
	} else if (rx == 0) {
		st->ready |= MESH_READY_RECV | MESH_READY_EOF;
	} else if (rx != -EAGAIN) {
		st->ready |= MESH_READY_RECV | MESH_READY_ERROR;
		st->error = (int32_t)rx;
	}
	if (tx > 0) {
		st->tx_free = (uint64_t)tx;
		st->ready |= MESH_READY_SEND;
	} else if (tx == -EPIPE) {
		st->ready |= MESH_READY_SEND | MESH_READY_SHUT;
	} else if (tx != 0) {
		st->ready |= MESH_READY_SEND | MESH_READY_ERROR;
		if (!st->error)
			st->error = (int32_t)tx;
	}
	/* meshd gone (and no next meshd took the channel over: its store keeps the lifeline open
	 * across a restart): whatever would wait fails with -MESH_EMESHDGONE (bytes in the ring come
	 * first). */
	if (c->meshd_gone) {
		st->ready |= MESH_READY_RECV | MESH_READY_SEND | MESH_READY_ERROR;
		if (!st->error)
			st->error = -MESH_EMESHDGONE;
	}
}
