package mesh

/*
#cgo pkg-config: mesh
#include <errno.h>
#include <stdlib.h>
#include <mesh/mesh.h>
*/
import "C"

import (
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Conn is a channel: a reliable, ordered byte stream to an application on another node. It
// implements net.Conn; one reader and one writer may use it at once, and every method may be called
// from any goroutine.
//
// Waiting never holds an OS thread: libmesh's channel fd (an epoll set that turns readable on
// every change of the channel, for either direction) is duplicated twice, each copy put in Go's
// runtime poller; Read waits on one, Write on the other, and both call libmesh without blocking
// (MESH_NONBLOCK) under a mutex (libmesh before 0.5 allowed one thread at a time on a channel;
// 0.5 serialises its calls itself, and the mutex also orders Close after both). Neither clears the
// fd (see ready): the two waiters share it.
type Conn struct {
	mu sync.Mutex // serialises the calls into libmesh
	ch *C.mesh_channel_t

	rf, wf *os.File        // the two duplicates of the channel fd, in the runtime poller
	rc, wc syscall.RawConn // their RawConns: Read waits on rc, Write on wc (both for readability)
	closed atomic.Bool

	laddr, raddr Addr
	info         ChannelInfo
}

// ChannelInfo describes a channel as meshd set it up.
type ChannelInfo struct {
	ID       uint32 // meshd's channel id (meshctl channels)
	QPs      int    // QPs of the link the channel stripes over
	RingSize int    // bytes of ring per direction
}

// pollFile duplicates fd (close-on-exec), makes the copy non-blocking and hands it to the runtime
// poller. The original stays libmesh's.
func pollFile(fd int, name string) (*os.File, syscall.RawConn, error) {
	nfd, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), syscall.F_DUPFD_CLOEXEC, 0)
	if e != 0 {
		return nil, nil, os.NewSyscallError("fcntl F_DUPFD_CLOEXEC", e)
	}
	if err := syscall.SetNonblock(int(nfd), true); err != nil {
		syscall.Close(int(nfd))
		return nil, nil, os.NewSyscallError("fcntl O_NONBLOCK", err)
	}
	f := os.NewFile(nfd, name)
	// A descriptor the poller did not take cannot have deadlines: say so now, not at the first wait.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, nil, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, rc, nil
}

// newConn wraps a channel libmesh just made; on failure the channel is closed.
func newConn(ch *C.mesh_channel_t) (*Conn, error) {
	var info C.struct_mesh_channel_info

	c := &Conn{ch: ch}
	fd := C.mesh_channel_fd(ch)
	if fd < 0 {
		C.mesh_close(ch)
		return nil, errorOf("mesh_channel_fd", int64(fd), "")
	}
	if ret := C.mesh_channel_info(ch, &info); ret < 0 {
		C.mesh_close(ch)
		return nil, errorOf("mesh_channel_info", int64(ret), "")
	}
	var err error
	if c.rf, c.rc, err = pollFile(int(fd), "mesh-channel-read"); err != nil {
		C.mesh_close(ch)
		return nil, err
	}
	if c.wf, c.wc, err = pollFile(int(fd), "mesh-channel-write"); err != nil {
		c.rf.Close()
		C.mesh_close(ch)
		return nil, err
	}
	c.laddr = Addr{Node: uint32(info.local_node), Port: uint16(info.local_port)}
	c.raddr = Addr{Node: uint32(info.peer_node), Port: uint16(info.peer_port)}
	c.info = ChannelInfo{ID: uint32(info.channel_id), QPs: int(info.qps), RingSize: int(info.ring_size)}
	return c, nil
}

// ready says whether a recv (want MESH_READY_RECV) or a send (MESH_READY_SEND) would not wait.
// It never clears the channel fd (MESH_STATUS_EDGE): Read and Write sleep on it at once, and a
// MESH_NONBLOCK call that returns -EAGAIN clears it, so a Write that found no space took the change
// a Read was sleeping for and left it asleep beside its bytes (both ends of a two-way stream then
// waited for each other until their deadlines). The runtime poller is edge-triggered: every change
// wakes both, cleared or not. The first look costs no system call; only before a wait does
// MESH_STATUS_EDGE ask whether meshd is still there. Called with c.mu held.
func (c *Conn) ready(want C.uint32_t) bool {
	var st C.struct_mesh_channel_status

	// An error (there is none with a valid channel and flags) lets the call report it.
	if C.mesh_channel_status(c.ch, 0, &st) < 0 || st.ready&want != 0 {
		return true
	}
	return C.mesh_channel_status(c.ch, C.MESH_STATUS_EDGE, &st) < 0 || st.ready&want != 0
}

// recv and send are one non-blocking libmesh call each, made only when it would not wait: a count,
// 0 (EOF), -EAGAIN or -errno.
func (c *Conn) recv(b []byte) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		return -int64(syscall.EBADF)
	}
	if !c.ready(C.MESH_READY_RECV) {
		return eagain
	}
	return int64(C.mesh_recv(c.ch, unsafe.Pointer(&b[0]), C.size_t(len(b)), C.MESH_NONBLOCK))
}

func (c *Conn) send(b []byte) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil {
		return -int64(syscall.EBADF)
	}
	if !c.ready(C.MESH_READY_SEND) {
		return eagain
	}
	return int64(C.mesh_send(c.ch, unsafe.Pointer(&b[0]), C.size_t(len(b)), C.MESH_NONBLOCK))
}

const eagain = -int64(syscall.EAGAIN)

// opError wraps err as package net does; a wait cut short by Close is net.ErrClosed.
func (c *Conn) opError(op string, err error) error {
	if c.closed.Load() {
		err = net.ErrClosed
	}
	return &net.OpError{Op: op, Net: "mesh", Source: c.laddr, Addr: c.raddr, Err: err}
}

// Read reads up to len(b) bytes; io.EOF once the peer shut its side (CloseWrite or Close) and
// every byte before was read.
func (c *Conn) Read(b []byte) (int, error) {
	if c.closed.Load() {
		return 0, c.opError("read", net.ErrClosed)
	}
	if len(b) == 0 {
		return 0, nil
	}
	var n int64
	err := c.rc.Read(func(uintptr) bool {
		n = c.recv(b)
		return n != eagain
	})
	if err != nil {
		return 0, c.opError("read", err)
	}
	if n < 0 {
		return 0, c.opError("read", errorOf("mesh_recv", n, ""))
	}
	if n == 0 {
		return 0, io.EOF
	}
	return int(n), nil
}

// Write writes all of b unless an error (a deadline, Close, the channel failing) stops it; it
// returns how many bytes went into the ring.
func (c *Conn) Write(b []byte) (int, error) {
	if c.closed.Load() {
		return 0, c.opError("write", net.ErrClosed)
	}
	done, ret := 0, int64(0)
	if len(b) == 0 {
		return 0, nil
	}
	err := c.wc.Read(func(uintptr) bool {
		for done < len(b) {
			r := c.send(b[done:])
			if r == eagain {
				return false
			}
			if r < 0 {
				ret = r
				return true
			}
			done += int(r)
		}
		return true
	})
	if err != nil {
		return done, c.opError("write", err)
	}
	if ret < 0 {
		return done, c.opError("write", errorOf("mesh_send", ret, ""))
	}
	return done, nil
}

// Close closes the channel: a Read or Write waiting on it returns net.ErrClosed, bytes already
// written still reach the peer, which then reads EOF.
func (c *Conn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return c.opError("close", net.ErrClosed)
	}
	// Closing the duplicates wakes the waiters and waits until none is inside libmesh any more.
	c.rf.Close()
	c.wf.Close()
	c.mu.Lock()
	ret := C.mesh_close(c.ch)
	c.ch = nil
	c.mu.Unlock()
	if ret < 0 {
		return &net.OpError{Op: "close", Net: "mesh", Source: c.laddr, Addr: c.raddr, Err: errorOf("mesh_close", int64(ret), "")}
	}
	return nil
}

// CloseWrite shuts the write side: the peer reads EOF after the last byte written; reading goes on.
// A later Write fails with EPIPE.
func (c *Conn) CloseWrite() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch == nil || c.closed.Load() {
		return c.opError("close", net.ErrClosed)
	}
	if ret := C.mesh_shutdown(c.ch); ret < 0 {
		return c.opError("close", errorOf("mesh_shutdown", int64(ret), ""))
	}
	return nil
}

// LocalAddr is this node and the channel's local port (an Addr).
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr is the peer's node and port (an Addr).
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// Info describes the channel (id, QPs, ring size).
func (c *Conn) Info() ChannelInfo { return c.info }

func (c *Conn) setDeadline(op string, err error) error {
	if err != nil {
		return c.opError(op, err)
	}
	return nil
}

// SetDeadline sets the read and the write deadline.
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline: a Read waiting past t (or called after it) fails with an error that satisfies
// errors.Is(err, os.ErrDeadlineExceeded) and Timeout(). The zero time clears it.
func (c *Conn) SetReadDeadline(t time.Time) error {
	return c.setDeadline("set", c.rf.SetReadDeadline(t))
}

// SetWriteDeadline is SetReadDeadline for Write. Both directions' readiness shows as readability
// of the channel fd, so the write side's duplicate waits (and times out) as a reader.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	return c.setDeadline("set", c.wf.SetReadDeadline(t))
}
