// Package mesh is the Go binding of libmesh: stream channels between applications on the nodes of
// an rdmamesh cluster, in the shape of package net.
//
//	c, err := mesh.Dial("mesh", "2:6000")   // node 2, port 6000
//	l, err := mesh.Listen("mesh", ":6000")   // port 6000 of this node
//
// A *Conn is a net.Conn (deadlines, Close unblocking Read and Write, CloseWrite), a *Listener a
// net.Listener, so net/http, io.Copy, bufio and the rest work unchanged. Waiting in Read, Write and
// Accept parks the goroutine in Go's runtime poller, never an OS thread; so does Dial, on the
// control connection of libmesh's non-blocking mesh_connect_start until meshd answers.
//
// The local meshd is reached through its control socket: Dialer.Socket or ListenConfig.Socket, else
// $MESH_SOCKET, else /run/meshd/meshd.sock.
package mesh

/*
#cgo pkg-config: mesh
#include <errno.h>
#include <stdlib.h>
#include <mesh/mesh.h>
*/
import "C"

import (
	"context"
	"math"
	"net"
	"os"
	"time"
	"unsafe"
)

// Dialer holds options for opening channels. The zero value is meshd's defaults.
type Dialer struct {
	// Socket is meshd's control socket; "" means $MESH_SOCKET, else /run/meshd/meshd.sock.
	Socket string
	// Timeout bounds the whole dial (meshd and the peer answering); 0 means libmesh's 30 s.
	// A context deadline that comes sooner wins.
	Timeout time.Duration
	// RingSize is the ring of each direction in bytes: a power of two from 4 KiB to 256 MiB; 0 means
	// meshd's default (1 MiB).
	RingSize int
	// QPs is how many of the link's QPs the channel stripes over (1..16); 0 means all of them.
	QPs int
	// WaitLink: when the link to the node is not UP yet, wait for it within the timeout (as a TCP
	// dial waits for a host that does not answer yet) instead of failing with syscall.ENETUNREACH
	// at once; without the link by then the dial fails with syscall.ETIMEDOUT. meshd waits
	// (MESH_OPT_WAIT_LINK; a meshd older than 0.5 answers ENETUNREACH at once).
	WaitLink bool
}

// Dial opens a channel with the zero Dialer: network "mesh", address "NODE:PORT".
func Dial(network, address string) (net.Conn, error) {
	var d Dialer
	return d.DialContext(context.Background(), network, address)
}

// Dial is DialContext with the background context.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialContext opens a channel to address ("NODE:PORT") and returns once the peer accepted it.
// Errors are *net.OpError around an *Error: errors.Is(err, syscall.ECONNREFUSED) when nobody
// listens on that port, mesh.EUNKNOWNNODE for a node outside the cluster, syscall.ENETUNREACH when
// the link to it is not UP (unless WaitLink). The goroutine parks in the runtime poller while meshd and the peer
// answer. A context cancelled before meshd answers returns at once with the context's error
// (context.Canceled, or os.ErrDeadlineExceeded for its deadline); meshd then sees the request's
// connection close and closes the channel if it comes.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	opErr := func(addr net.Addr, err error) error {
		return &net.OpError{Op: "dial", Net: network, Addr: addr, Err: err}
	}
	if network != "mesh" {
		return nil, opErr(nil, net.UnknownNetworkError(network))
	}
	addr, err := ParseAddr(address)
	if err != nil {
		return nil, opErr(nil, err)
	}
	var opts C.struct_mesh_channel_opts
	if d.RingSize != 0 {
		if d.RingSize < 0 || uint64(d.RingSize) > math.MaxUint32*4 {
			return nil, opErr(addr, &Error{Func: "mesh_connect", Code: 22 /* EINVAL */, Detail: "RingSize out of range"})
		}
		opts.mask |= C.MESH_OPT_RING_SIZE
		opts.ring_size = C.uint64_t(d.RingSize)
	}
	if d.QPs != 0 {
		if d.QPs < 0 || d.QPs > 1<<16 {
			return nil, opErr(addr, &Error{Func: "mesh_connect", Code: 22, Detail: "QPs out of range"})
		}
		opts.mask |= C.MESH_OPT_QPS
		opts.qps = C.uint32_t(d.QPs)
	}
	if d.WaitLink {
		opts.mask |= C.MESH_OPT_WAIT_LINK
	}
	timeout := d.Timeout
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left <= 0 {
			return nil, opErr(addr, os.ErrDeadlineExceeded)
		}
		if timeout <= 0 || left < timeout {
			timeout = left
		}
	}
	if timeout > 0 {
		ms := (timeout + time.Millisecond - 1) / time.Millisecond
		if ms > math.MaxUint32 {
			ms = math.MaxUint32
		}
		opts.mask |= C.MESH_OPT_TIMEOUT_MS
		opts.timeout_ms = C.uint32_t(ms)
	}
	if err := ctx.Err(); err != nil {
		return nil, opErr(addr, ctxError(err))
	}
	c, err := d.connect(ctx, addr, &opts, timeout)
	if err != nil {
		return nil, opErr(addr, err)
	}
	return c, nil
}

func ctxError(err error) error {
	if err == context.DeadlineExceeded {
		return os.ErrDeadlineExceeded
	}
	return err
}

// session opens a libmesh session on the socket ("" for libmesh's default).
func session(socket string) (*C.mesh_session_t, error) {
	var s *C.mesh_session_t
	var path *C.char

	if socket != "" {
		path = C.CString(socket)
		defer C.free(unsafe.Pointer(path))
	}
	if ret := C.mesh_open(path, &s); ret < 0 {
		return nil, errorOf("mesh_open", int64(ret), "")
	}
	return s, nil
}

// dialSlots bounds the dials inside libmesh's calls that open the session and send the request.
// Those calls are short but each holds an OS thread while it runs, and the runtime starts another
// thread for the other goroutines whenever one lasts a while: 1000 goroutines dialling at once made
// 82 threads under the race detector. A goroutine waiting for a slot parks like any channel waiter.
var dialSlots = make(chan struct{}, 8)

// start opens the session and sends the request, in a slot (or gives up when ctx is done first).
func (d *Dialer) start(ctx context.Context, addr Addr, opts *C.struct_mesh_channel_opts) (*C.mesh_session_t, *C.mesh_connecting_t, error) {
	var p *C.mesh_connecting_t

	select {
	case dialSlots <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctxError(ctx.Err())
	}
	defer func() { <-dialSlots }()
	s, err := session(d.Socket)
	if err != nil {
		return nil, nil, err
	}
	if ret := C.mesh_connect_start(s, C.uint32_t(addr.Node), C.uint16_t(addr.Port), opts, &p); ret < 0 {
		err = errorOf("mesh_connect", int64(ret), C.GoString(C.mesh_session_error(s)))
		C.mesh_session_close(s)
		return nil, nil, err
	}
	return s, p, nil
}

// connect sends the request (mesh_connect_start) and parks in the runtime poller on its control
// connection until meshd answers, the timeout passes or ctx is done: no OS thread waits.
func (d *Dialer) connect(ctx context.Context, addr Addr, opts *C.struct_mesh_channel_opts, timeout time.Duration) (*Conn, error) {
	var ch *C.mesh_channel_t

	s, p, err := d.start(ctx, addr, opts)
	if err != nil {
		return nil, err
	}
	defer C.mesh_session_close(s)
	f, rc, err := pollFile(int(C.mesh_connect_fd(p)), "mesh-connect")
	if err != nil {
		C.mesh_connect_cancel(p)
		return nil, err
	}
	defer f.Close()
	if timeout <= 0 {
		timeout = 30 * time.Second // libmesh's default: its finish says -ETIMEDOUT then
	}
	f.SetReadDeadline(time.Now().Add(timeout + 10*time.Millisecond))
	done := make(chan struct{})
	defer close(done)
	if ctx.Done() != nil {
		go func() {
			select {
			case <-ctx.Done():
				f.SetReadDeadline(time.Unix(1, 0)) // in the past: wakes the waiter now
			case <-done:
			}
		}()
	}
	ret := C.int(-C.EAGAIN)
	werr := rc.Read(func(uintptr) bool {
		ret = C.mesh_connect_finish(p, &ch)
		return ret != -C.EAGAIN
	})
	if ret == -C.EAGAIN {
		// Woken by the deadline or ctx before meshd answered: the pending connect is still ours.
		C.mesh_connect_cancel(p)
		if err := ctx.Err(); err != nil {
			return nil, ctxError(err)
		}
		if werr == nil || os.IsTimeout(werr) {
			return nil, errorOf("mesh_connect", -int64(C.ETIMEDOUT), "meshd did not answer in time")
		}
		return nil, werr
	}
	if ret < 0 {
		return nil, errorOf("mesh_connect", int64(ret), C.GoString(C.mesh_session_error(s)))
	}
	return newConn(ch)
}
