/*
 * libmesh_preload internals: the descriptor table, the real libc functions and the helpers shared
 * by the files of the preload library. Nothing here is exported.
 */
#ifndef MESH_PRELOAD_H
#define MESH_PRELOAD_H

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <mesh/mesh.h>

#define PL_FD_MAX 65536 /* descriptors at or above this number are never made channels */

/* The functions we interpose, as the next object (libc) defines them. */
struct pl_real {
	int (*socket)(int, int, int);
	int (*connect)(int, const struct sockaddr *, socklen_t);
	int (*listen)(int, int);
	int (*accept4)(int, struct sockaddr *, socklen_t *, int);
	int (*close)(int);
	int (*dup)(int);
	int (*dup2)(int, int);
	int (*dup3)(int, int, int);
	int (*fcntl)(int, int, ...);
	int (*ioctl)(int, unsigned long, ...);
	ssize_t (*read)(int, void *, size_t);
	ssize_t (*write)(int, const void *, size_t);
	ssize_t (*readv)(int, const struct iovec *, int);
	ssize_t (*writev)(int, const struct iovec *, int);
	ssize_t (*recvfrom)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
	ssize_t (*sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
	ssize_t (*recvmsg)(int, struct msghdr *, int);
	ssize_t (*sendmsg)(int, const struct msghdr *, int);
	ssize_t (*sendfile)(int, int, off_t *, size_t);
	int (*getsockopt)(int, int, int, void *, socklen_t *);
	int (*setsockopt)(int, int, int, const void *, socklen_t);
	int (*getsockname)(int, struct sockaddr *, socklen_t *);
	int (*getpeername)(int, struct sockaddr *, socklen_t *);
	int (*shutdown)(int, int);
	int (*poll)(struct pollfd *, nfds_t, int);
	int (*ppoll)(struct pollfd *, nfds_t, const struct timespec *, const sigset_t *);
	int (*select)(int, fd_set *, fd_set *, fd_set *, struct timeval *);
	int (*pselect)(int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *);
	int (*epoll_ctl)(int, int, int, struct epoll_event *);
	int (*epoll_wait)(int, struct epoll_event *, int, int);
	int (*epoll_pwait)(int, struct epoll_event *, int, int, const sigset_t *);
	ssize_t (*pread)(int, void *, size_t, off_t);
};
extern struct pl_real pl_real;

/* A descriptor of the application that is more than a kernel socket. */
enum pl_kind {
	PL_CHANNEL,  /* a mesh channel: the real descriptor is a duplicate of mesh_channel_fd */
	PL_LISTENER, /* a kernel TCP listener that also accepts mesh channels to its port */
};

#define PL_OPTS_MAX 8

/* Who uses a channel, in a page shared with every process forked since it was made (fork keeps
 * MAP_SHARED mappings shared): a channel has one user at a time, since each process has its own
 * copy of the ring indices and they part at the first use after the fork. */
#define PL_USER_NONE 0    /* nobody since the last fork: the first process to use it takes it */
#define PL_USER_CLOSED -1 /* its user closed it */
struct pl_share {
	_Atomic int32_t user;    /* a pid, PL_USER_NONE or PL_USER_CLOSED */
	_Atomic int32_t holders; /* processes with a descriptor of it (a child counts from its fork) */
};

struct pl_fd {
	enum pl_kind kind;
	atomic_int refs;         /* the table's slots (dup) and calls in progress */
	pthread_mutex_t lock;    /* one libmesh call at a time on ch */
	mesh_channel_t *ch;
	mesh_listener_t *ls;
	int lfd;                 /* listener: mesh_listener_fd */
	struct pl_share *share;  /* channel: who uses it, across fork */
	bool fork_locked;        /* lock taken by the fork handler (pl_table_fork) */
	atomic_bool nonblock;    /* O_NONBLOCK as the application set it */
	atomic_bool connecting;  /* a non-blocking connect() that has not been looked at yet */
	bool cloexec;            /* FD_CLOEXEC as the application set it (the real one is always set) */
	bool rd_shut;            /* shutdown(SHUT_RD) */
	int family;              /* AF_INET or AF_INET6, as the application's socket() */
	struct sockaddr_storage local, peer;
	socklen_t local_len, peer_len;
	struct {
		int level, name, value;
	} opts[PL_OPTS_MAX];     /* setsockopt values kept for getsockopt */
	int n_opts;
};

/* glibc's _FORTIFY_SOURCE entry points (programs built with it call these instead). */
ssize_t __read_chk(int fd, void *buf, size_t len, size_t buflen);
ssize_t __recv_chk(int fd, void *buf, size_t len, size_t buflen, int flags);
ssize_t __recvfrom_chk(int fd, void *buf, size_t len, size_t buflen, int flags, struct sockaddr *sa, socklen_t *sl);
int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen);
int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *ts, const sigset_t *mask, size_t fdslen);
int fcntl64(int fd, int cmd, ...);
ssize_t sendfile64(int out, int in, off_t *offset, size_t count);

/* The calls of the preload library go one way between its files: preload.c (the interposers)
 * above sock.c (descriptors becoming channels) and chan.c (what the calls mean on a channel),
 * sock.c above poll.c (poll, select, epoll), all of them above fdtab.c (the descriptor table) and
 * nodes.c (the node table), above base.c (libc, the environment, warnings, the clock). */

/* ---- base.c ---- */

/* MESH_PRELOAD_DEBUG=1: say on stderr what became a channel. */
extern bool pl_debug_on;
#define PL_DEBUG(...)                              \
	do {                                       \
		if (pl_debug_on)                   \
			pl_warn(0, __VA_ARGS__);   \
	} while (0)

/* Resolves the real functions and reads the environment if the constructor has not run yet. */
void pl_ensure_init(void);
/* True when the calling thread is inside libmesh or the preload is off: pass everything through. */
bool pl_bypass(void);
/* Marks the calling thread as inside libmesh (so libmesh's own system calls reach the kernel). */
void pl_lib_enter(void);
void pl_lib_leave(void);
/* Whether connections to or listeners on port may go over the mesh (MESH_PRELOAD_PORTS). */
bool pl_port_wanted(uint16_t port);
/* Warns on stderr, once per distinct key (0: always). */
void pl_warn(unsigned key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A libmesh error as an errno the application understands; the mesh's own codes become
 * ECONNRESET (named once on stderr). */
int pl_app_errno(int err);
/* A monotonic clock in microseconds. */
uint64_t pl_mono_us(void);

/* A spin before a sleep that reads the clock only every PL_SPIN_LOOKS looks: where the clock source
 * is an emulated HPET (the Soft-RoCE VM) a reading is a system call of about 2 us, and a look that
 * read it (twice, with a deadline) spent more on the clock than on the look. until 0: no spin. */
#define PL_SPIN_LOOKS 8u
struct pl_spin {
	uint64_t until, now;
	unsigned looks;
};
void pl_spin_start(struct pl_spin *s, uint32_t spin_us);
/* Whether to look once more: the budget not spent and deadline_ms (a pl_mono_us() / 1000 value, or
 * negative for none) not reached, as far as the clock last read says. */
bool pl_spin_on(struct pl_spin *s, int64_t deadline_ms);

/* ---- fdtab.c ---- */

/* A new entry with one reference (the caller's), owned by this process. */
struct pl_fd *pl_new(enum pl_kind kind, int family);
/* The entry of a descriptor with a reference taken, or NULL; pl_put drops it. */
struct pl_fd *pl_get(int fd);
/* pl_get for an interposer: NULL also while the preload is bypassed (pl_bypass). */
struct pl_fd *pl_lookup(int fd);
/* pl_lookup of a channel only: NULL for anything else, which then goes to libc. */
struct pl_fd *pl_chan_get(int fd);
void pl_put(struct pl_fd *p);
/* Puts p at fd (taking a reference); returns what was there, which the caller puts. */
struct pl_fd *pl_table_set(int fd, struct pl_fd *p);
/* Any tracked descriptor at all (cheap: no lock). */
bool pl_tracked(int fd);
/* Whether this process may use the channel: it is its user, or nobody used it since the last fork
 * and this process now becomes its user. Never calls libmesh: a process that is not the user must
 * not touch the channel (its eventfds and control page are shared with the user). */
bool pl_chan_mine(struct pl_fd *p);
/* The process that uses the channel (a pid, PL_USER_NONE or PL_USER_CLOSED). */
int pl_chan_user(const struct pl_fd *p);
/* This process's id, kept across fork (getpid() is a system call). */
pid_t pl_pid(void);
/* fork(): every lock of the table and its entries taken before (prepare), released after in the
 * parent, made anew in the child; the child counts as a holder of every channel from the prepare
 * on, and a channel this process used becomes nobody's (PL_USER_NONE), so that whichever process
 * uses it first after the fork takes it. */
enum pl_fork_stage { PL_FORK_PREPARE, PL_FORK_PARENT, PL_FORK_CHILD };
void pl_table_fork(enum pl_fork_stage stage);
/* The channel's readiness as poll bits (POLLIN, POLLOUT, POLLERR, POLLHUP, POLLRDHUP), all of them;
 * with arm, the channel fd is cleared first so that it wakes on the next change. */
short pl_chan_revents(struct pl_fd *p, bool arm);
/* The channel's spin budget in microseconds (mesh_channel_status), 0 if unknown. */
uint32_t pl_chan_spin_us(struct pl_fd *p);

/* ---- nodes.c ---- */

struct pl_node {
	uint32_t id;
	bool self;
	int family;
	uint8_t addr[16];
};

/* Learns meshd's node table on the first call; false: no mesh, everything stays plain TCP. */
bool pl_nodes_ready(void);
/* fork(): the node table's lock held across it (a child never inherits it taken by a thread it lacks). */
void pl_nodes_fork(enum pl_fork_stage stage);
/* The session the node table came from: every channel is made on it. */
mesh_session_t *pl_session(void);
const struct pl_node *pl_node_by_addr(int family, const uint8_t *addr);
const struct pl_node *pl_node_by_id(uint32_t id);
const struct pl_node *pl_node_self(void);
/* The address of sa as (family, bytes) and its port; v4-mapped IPv6 is IPv4; -1: neither. */
int pl_sa_addr(const struct sockaddr *sa, socklen_t len, uint8_t out[16], uint16_t *port);
/* 127.0.0.0/8 or ::1: the kernel would deliver it on this host. */
bool pl_addr_is_loopback(int family, const uint8_t *addr);
/* A node's address (n NULL: any) and a port as a sockaddr of the socket's family. */
void pl_sa_make(int family, const struct pl_node *n, uint16_t port, struct sockaddr_storage *ss, socklen_t *len);
/* Copies ss out as getsockname() would (truncated to *out_len, which becomes len). */
void pl_sa_copy_out(const struct sockaddr_storage *ss, socklen_t len, struct sockaddr *out, socklen_t *out_len);

/* ---- chan.c ---- */

/* The socket calls on a channel, given the reference pl_chan_get took, which each drops. They
 * return as the calls do: a count or 0, or -1 with errno. */
ssize_t pl_chan_read(struct pl_fd *p, void *buf, size_t len);
ssize_t pl_chan_write(struct pl_fd *p, const void *buf, size_t len);
ssize_t pl_chan_readv(struct pl_fd *p, const struct iovec *iov, int n);
ssize_t pl_chan_writev(struct pl_fd *p, const struct iovec *iov, int n);
ssize_t pl_chan_recvfrom(struct pl_fd *p, void *buf, size_t len, int flags, struct sockaddr *sa, socklen_t *sl);
ssize_t pl_chan_sendto(struct pl_fd *p, const void *buf, size_t len, int flags);
ssize_t pl_chan_recvmsg(struct pl_fd *p, struct msghdr *m, int flags);
ssize_t pl_chan_sendmsg(struct pl_fd *p, const struct msghdr *m, int flags);
/* From the file in straight into the channel's send ring. */
ssize_t pl_chan_sendfile(struct pl_fd *p, int in, off_t *offset, size_t count);
int pl_chan_ioctl(struct pl_fd *p, unsigned long req, void *arg);
int pl_chan_getsockopt(struct pl_fd *p, int level, int name, void *val, socklen_t *len);
int pl_chan_setsockopt(struct pl_fd *p, int level, int name, const void *val, socklen_t len);
/* getsockname (peer false) or getpeername (peer true). */
int pl_chan_name(struct pl_fd *p, struct sockaddr *sa, socklen_t *sl, bool peer);
int pl_chan_shutdown(struct pl_fd *p, int how);

/* ---- sock.c ---- */

/* connect() to a node's address: a channel at fd, or the kernel's connect when it cannot be one. */
int pl_connect(int fd, const struct sockaddr *sa, socklen_t len);
/* The kernel's listen(), and a mesh listener on the same port beside it where it can be. */
int pl_listen(int fd, int backlog);
/* accept4() on an entry (a listener: channels and kernel connections), given its reference. */
int pl_accept(struct pl_fd *p, int fd, struct sockaddr *sa, socklen_t *sl, int flags);
/* close, dup, dup2, dup3 where a tracked descriptor is involved: the table follows the kernel. */
int pl_close(int fd);
int pl_dup(int fd);
int pl_dup2(int oldfd, int newfd);
int pl_dup3(int oldfd, int newfd, int flags);
/* fcntl() on an entry, given its reference. */
int pl_fcntl(struct pl_fd *p, int fd, int cmd, long arg);

/* ---- poll.c ---- */

/* The descriptor fd was closed or replaced: forget its epoll registrations; an epoll fd its set. */
void pl_epoll_forget(int fd);
/* fork(): the registries' locks held across it. */
void pl_epoll_fork(enum pl_fork_stage stage);
/* Whether any descriptor of the set is tracked (else the call is libc's). */
bool pl_poll_tracked(const struct pollfd *fds, nfds_t n);
bool pl_select_tracked(int nfds, fd_set *rd, fd_set *wr, fd_set *ex);
/* A timeout in milliseconds (-1: none) from ppoll's or pselect's timespec, or select's timeval. */
int pl_ts_ms(const struct timespec *ts);
int pl_tv_ms(const struct timeval *tv);
/* poll, ppoll, select and pselect over channels and kernel descriptors together. */
int pl_poll(struct pollfd *fds, nfds_t n, int timeout_ms, const sigset_t *mask);
int pl_select(int nfds, fd_set *rd, fd_set *wr, fd_set *ex, int timeout_ms, const sigset_t *mask);
/* epoll_ctl on an entry, given its reference; epoll_wait and epoll_pwait (mask). */
int pl_epoll_ctl(struct pl_fd *p, int epfd, int op, int fd, struct epoll_event *ev);
int pl_epoll_wait(int epfd, struct epoll_event *out, int max, int timeout, const sigset_t *mask);

#endif
