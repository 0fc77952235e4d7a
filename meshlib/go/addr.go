package mesh

import (
	"errors"
	"net"
	"strconv"
)

// Addr is a channel's end: a node of the cluster and a port on it. Its network is "mesh" and its
// text "NODE:PORT", the form Dial takes.
type Addr struct {
	Node uint32
	Port uint16
}

// Network is "mesh".
func (a Addr) Network() string { return "mesh" }

func (a Addr) String() string {
	return strconv.FormatUint(uint64(a.Node), 10) + ":" + strconv.FormatUint(uint64(a.Port), 10)
}

// nodeUnknown is libmesh's MESH_NODE_UNKNOWN: meshd did not name its node.
const nodeUnknown = 0xffffffff

const nodeIDMax = 65535

// ParseAddr parses "NODE:PORT" (decimal node id 0..65535 and port 0..65535).
func ParseAddr(s string) (Addr, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return Addr{}, err
	}
	node, err := strconv.ParseUint(host, 10, 32)
	if err != nil || node > nodeIDMax {
		return Addr{}, &net.AddrError{Err: "node is not a number in 0..65535", Addr: s}
	}
	p, err := parsePort(port)
	if err != nil {
		return Addr{}, &net.AddrError{Err: err.Error(), Addr: s}
	}
	return Addr{Node: uint32(node), Port: p}, nil
}

func parsePort(s string) (uint16, error) {
	p, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0, errors.New("port is not a number in 0..65535")
	}
	return uint16(p), nil
}

// parseListenAddr parses ":PORT". The mesh assigns no ephemeral listening ports: port 0 is refused.
func parseListenAddr(s string) (uint16, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return 0, err
	}
	if host != "" {
		return 0, &net.AddrError{Err: "a listener takes \":PORT\" (it listens on this node only)", Addr: s}
	}
	p, err := parsePort(port)
	if err != nil {
		return 0, &net.AddrError{Err: err.Error(), Addr: s}
	}
	if p == 0 {
		return 0, &net.AddrError{Err: "port 0: the mesh assigns no ephemeral listening ports", Addr: s}
	}
	return p, nil
}
