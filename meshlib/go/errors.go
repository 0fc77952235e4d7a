package mesh

/*
#cgo pkg-config: mesh
#include <mesh/mesh.h>
*/
import "C"

import (
	"syscall"
)

// Mesh-specific error codes (mesh.h, enum mesh_errno), as syscall.Errno values so that
// errors.Is(err, mesh.EUNKNOWNNODE) works like errors.Is(err, syscall.ECONNREFUSED).
const (
	EUNKNOWNNODE = syscall.Errno(C.MESH_EUNKNOWNNODE) // node not in the cluster's configuration
	EBUSY        = syscall.Errno(C.MESH_EBUSY)        // meshd busy; try later
	EPEERRESTART = syscall.Errno(C.MESH_EPEERRESTART) // the peer's meshd restarted: the channel is gone there
	ERESUMETIMEO = syscall.Errno(C.MESH_ERESUMETIMEO) // the link stayed DOWN past cluster.resume_timeout_ms
	EAUTH        = syscall.Errno(C.MESH_EAUTH)        // the peer did not prove the cluster key
	EREFUSED     = syscall.Errno(C.MESH_EREFUSED)     // the peer refused; its log says why
	EREMOVED     = syscall.Errno(C.MESH_EREMOVED)     // the peer node was removed from the configuration
	EDRAINING    = syscall.Errno(C.MESH_EDRAINING)    // the node is draining for maintenance: no new channels
	ERESTARTING  = syscall.Errno(C.MESH_ERESTARTING)  // the peer's meshd is restarting: channels wait for it
	EMESHDGONE   = syscall.Errno(C.MESH_EMESHDGONE)   // the local meshd is gone and did not come back
)

// Error is a failure reported by libmesh or meshd. Code is the errno (a syscall.Errno, or one of
// the mesh codes above); Func names the libmesh call; Detail is meshd's own explanation, when it
// gave one. It unwraps to Code, so errors.Is(err, syscall.ECONNREFUSED) works through the
// *net.OpError that wraps it.
type Error struct {
	Func   string
	Code   syscall.Errno
	Detail string

	temporary bool // the object that failed keeps working (an Accept that lost one channel)
}

func (e *Error) Error() string {
	s := e.Func + ": " + Strerror(e.Code)
	if e.Detail != "" {
		s += " (" + e.Detail + ")"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Code }

// Timeout reports whether the call timed out (ETIMEDOUT).
func (e *Error) Timeout() bool { return e.Code.Timeout() }

// Temporary reports whether retrying may succeed: net/http's Serve keeps accepting after such an
// Accept error.
func (e *Error) Temporary() bool { return e.temporary || e.Code.Temporary() }

// Strerror is mesh_strerror: the name of an errno or mesh code.
func Strerror(code syscall.Errno) string {
	return C.GoString(C.mesh_strerror(-C.int(code)))
}

// errorOf turns a negative return value of libmesh into an *Error.
func errorOf(fn string, ret int64, detail string) *Error {
	return &Error{Func: fn, Code: syscall.Errno(-ret), Detail: detail}
}
