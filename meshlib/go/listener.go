package mesh

/*
#cgo pkg-config: mesh
#include <mesh/mesh.h>
*/
import "C"

import (
	"context"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
)

// ListenConfig holds options for listening.
type ListenConfig struct {
	// Socket is meshd's control socket; "" means $MESH_SOCKET, else /run/meshd/meshd.sock.
	Socket string
}

// Listen listens on port PORT of this node (address ":PORT") through the default socket.
func Listen(network, address string) (net.Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), network, address)
}

// Listener accepts channels to one port of this node. It implements net.Listener.
type Listener struct {
	mu     sync.Mutex // serialises the calls into libmesh
	l      *C.mesh_listener_t
	f      *os.File // a duplicate of the listener's fd, in the runtime poller
	rc     syscall.RawConn
	closed atomic.Bool
	addr   Addr
}

// Listen listens on address ":PORT" (network "mesh"). meshd answers at once: -EADDRINUSE when the
// port is taken, -EACCES below 1024 unless root. ctx is only checked before the request.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	opErr := func(addr net.Addr, err error) error {
		return &net.OpError{Op: "listen", Net: network, Addr: addr, Err: err}
	}
	if network != "mesh" {
		return nil, opErr(nil, net.UnknownNetworkError(network))
	}
	port, err := parseListenAddr(address)
	if err != nil {
		return nil, opErr(nil, err)
	}
	addr := Addr{Node: nodeUnknown, Port: port}
	if err := ctx.Err(); err != nil {
		return nil, opErr(addr, ctxError(err))
	}
	s, err := session(lc.Socket)
	if err != nil {
		return nil, opErr(addr, err)
	}
	defer C.mesh_session_close(s)
	var ml *C.mesh_listener_t
	if ret := C.mesh_listen(s, C.uint16_t(port), &ml); ret < 0 {
		return nil, opErr(addr, errorOf("mesh_listen", int64(ret), C.GoString(C.mesh_session_error(s))))
	}
	var info C.struct_mesh_listener_info
	if ret := C.mesh_listener_info(ml, &info); ret < 0 {
		C.mesh_listener_close(ml)
		return nil, opErr(addr, errorOf("mesh_listener_info", int64(ret), ""))
	}
	addr.Node = uint32(info.node)
	l := &Listener{l: ml, addr: addr}
	if l.f, l.rc, err = pollFile(int(C.mesh_listener_fd(ml)), "mesh-listener"); err != nil {
		C.mesh_listener_close(ml)
		return nil, opErr(addr, err)
	}
	return l, nil
}

func (l *Listener) opError(err error) error {
	if l.closed.Load() {
		err = net.ErrClosed
	}
	return &net.OpError{Op: "accept", Net: "mesh", Addr: l.addr, Err: err}
}

// Accept waits for the next channel; it is AcceptMesh as a net.Conn.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.AcceptMesh()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptMesh waits for the next channel. An error that concerns one incoming channel only (meshd
// sent a bad setup, out of descriptors) is Temporary: the listener keeps working. ECONNRESET
// means meshd closed the listener for good; net.ErrClosed that Close was called.
func (l *Listener) AcceptMesh() (*Conn, error) {
	if l.closed.Load() {
		return nil, l.opError(net.ErrClosed)
	}
	var ch *C.mesh_channel_t
	var ret int64
	err := l.rc.Read(func(uintptr) bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.l == nil {
			ret = -int64(syscall.EBADF)
			return true
		}
		ret = int64(C.mesh_accept(l.l, C.MESH_NONBLOCK, &ch))
		return ret != eagain
	})
	if err != nil {
		return nil, l.opError(err)
	}
	if ret < 0 {
		e := errorOf("mesh_accept", ret, "")
		e.temporary = e.Code != syscall.ECONNRESET && e.Code != syscall.EBADF
		return nil, l.opError(e)
	}
	c, err := newConn(ch)
	if err != nil {
		if e, ok := err.(*Error); ok {
			e.temporary = true
		}
		return nil, l.opError(err)
	}
	return c, nil
}

// Close stops listening: a waiting Accept returns net.ErrClosed; channels already accepted stay.
func (l *Listener) Close() error {
	if !l.closed.CompareAndSwap(false, true) {
		return l.opError(net.ErrClosed)
	}
	l.f.Close()
	l.mu.Lock()
	C.mesh_listener_close(l.l)
	l.l = nil
	l.mu.Unlock()
	return nil
}

// Addr is this node and the listening port (an Addr).
func (l *Listener) Addr() net.Addr { return l.addr }
