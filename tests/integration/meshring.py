"""A raw client of meshd's channel protocol, for tests that must do what libmesh never does:
write nonsense into the shared ring, die at awkward moments, or check the wire by hand.

It speaks ctl.proto with a minimal hand-written protobuf encoder/decoder (stdlib only), receives
the four descriptors of a channel (memfd, lifeline, kick, wake) with SCM_RIGHTS and maps the ring
as proto/ring.h lays it out.
"""
import ctypes
import mmap
import os
import socket
import struct

CTL_VERSION = 1
OP_LISTEN, OP_CONNECT = 1, 2
OBJ_CHANNELS = 3

# struct mesh_ring_ctrl offsets (proto/ring.h; checked by the test against a C build when in doubt)
OFF_MAGIC, OFF_RING_SIZE, OFF_TX_OFF, OFF_RX_OFF = 0, 8, 16, 24
OFF_CHANNEL_ID, OFF_PEER_NODE = 32, 36
OFF_TX_PROD, OFF_RX_CONS, OFF_APP_FLAGS = 64, 128, 192
OFF_TX_CONS, OFF_RX_PROD, OFF_STATE, OFF_ERROR = 256, 320, 384, 388
RING_MAGIC = 0x4D52494E
APP_WAITING, APP_SHUT_WR = 1, 2
STATE_OPEN, STATE_PEER_EOF, STATE_ERROR = 1, 2, 4


def _varint(v):
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def encode_request(**fields):
    """CtlRequest from keyword fields (field numbers of ctl.proto)."""
    numbers = dict(version=1, object=2, op=3, port=4, node=5, ring_size=6, qps=7, has_numa=8, numa_node=9,
                   has_caller_node=10, caller_node=11, has_rail=12, rail=13)
    out = b""
    for name, value in fields.items():
        out += _varint(numbers[name] << 3) + _varint(value)
    return out


def _decode(buf):
    """protobuf fields -> {number: [values]} (varints as ints, length-delimited as bytes)."""
    i, fields = 0, {}
    while i < len(buf):
        key, i = _read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _read_varint(buf, i)
        elif wt == 2:
            n, i = _read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("bad wire type")
        fields.setdefault(num, []).append(v)
    return fields


def _read_varint(buf, i):
    shift = v = 0
    while True:
        b = buf[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


class Reply:
    def __init__(self, data, fds):
        f = _decode(data)
        self.status = _signed(f.get(1, [0])[0])
        self.error = f.get(2, [b""])[0].decode(errors="replace")
        self.setup = None
        self.fds = fds
        self.channels = [_decode(c) for c in f.get(5, [])]
        if 6 in f:
            s = _decode(f[6][0])
            self.setup = {k: s.get(n, [0])[0] for k, n in
                          dict(channel_id=1, peer_node=2, local_port=3, peer_port=4, ring_size=5,
                               memfd_size=6, qps=7).items()}


def _recv_reply(sock, timeout=30):
    sock.settimeout(timeout)
    data, anc, flags, _ = sock.recvmsg(1 << 20, socket.CMSG_SPACE(4 * 4))
    fds = []
    for level, typ, payload in anc:
        if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
            fds += list(struct.unpack(f"{len(payload) // 4}i", payload[:len(payload) // 4 * 4]))
    if not data and not fds:
        raise ConnectionError("meshd closed the connection")
    return Reply(data, fds)


def _open(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(path)
    return s


class Channel:
    def __init__(self, reply):
        if reply.status:
            raise OSError(-reply.status, f"meshd: {reply.error}")
        if len(reply.fds) != 4 or not reply.setup:
            raise ValueError(f"expected a setup and 4 descriptors, got {len(reply.fds)}")
        self.memfd, self.life, self.kick, self.wake = reply.fds
        self.info = reply.setup
        self.size = reply.setup["ring_size"]
        self.map = mmap.mmap(self.memfd, reply.setup["memfd_size"])
        assert self.u32(OFF_MAGIC) == RING_MAGIC and self.u64(OFF_RING_SIZE) == self.size
        self.tx_off, self.rx_off = self.u64(OFF_TX_OFF), self.u64(OFF_RX_OFF)
        self.tx_prod = self.rx_cons = 0

    # The indices and flags are shared with meshd while it runs: each is read and written with one
    # aligned load or store (ctypes), as C11 atomics would. struct.pack_into/unpack_from go byte by
    # byte, so meshd could see a half-written index (a torn value it rightly refuses with -EPROTO).
    def u32(self, off):
        return ctypes.c_uint32.from_buffer(self.map, off).value

    def u64(self, off):
        return ctypes.c_uint64.from_buffer(self.map, off).value

    def put32(self, off, v):
        ctypes.c_uint32.from_buffer(self.map, off).value = v & 0xFFFFFFFF

    def put64(self, off, v):
        ctypes.c_uint64.from_buffer(self.map, off).value = v & ((1 << 64) - 1)

    def do_kick(self):
        os.write(self.kick, struct.pack("<Q", 1))

    def send(self, data):
        """Copies as much as fits into the TX ring; returns the count."""
        free = self.u64(OFF_TX_CONS) + self.size - self.tx_prod
        n = min(len(data), free)
        for i in range(n):  # byte by byte is slow but simple; tests send little this way
            self.map[self.tx_off + ((self.tx_prod + i) & (self.size - 1))] = data[i]
        self.tx_prod += n
        self.put64(OFF_TX_PROD, self.tx_prod)
        self.do_kick()
        return n

    def recv(self, n):
        avail = self.u64(OFF_RX_PROD) - self.rx_cons
        n = min(n, avail)
        out = bytes(self.map[self.rx_off + ((self.rx_cons + i) & (self.size - 1))] for i in range(n))
        self.rx_cons += n
        self.put64(OFF_RX_CONS, self.rx_cons)
        self.do_kick()
        return out

    def page_nodes(self, offsets):
        """The NUMA node of the pages at these offsets of our mapping, asked of the kernel
        (move_pages); a negative errno for a page that is not there."""
        import ctypes
        page = mmap.PAGESIZE
        for off in offsets:
            self.map[off - off % page]  # present in our page tables, or the kernel reports -ENOENT
        anchor = ctypes.c_char.from_buffer(self.map)
        try:
            base = ctypes.addressof(anchor)
            n = len(offsets)
            pages = (ctypes.c_void_p * n)(*[base + off - off % page for off in offsets])
            status = (ctypes.c_int * n)()
            numa = ctypes.CDLL("libnuma.so.1", use_errno=True)
            # move_pages(pid 0 = us, count, pages, nodes NULL = only ask, status, flags 0)
            if numa.move_pages(0, ctypes.c_ulong(n), pages, None, status, 0) != 0:
                raise OSError(ctypes.get_errno(), "move_pages")
            return list(status)
        finally:
            del anchor

    def state(self):
        return self.u32(OFF_STATE), ctypes.c_int32.from_buffer(self.map, OFF_ERROR).value

    def shutdown(self):
        self.put32(OFF_APP_FLAGS, self.u32(OFF_APP_FLAGS) | APP_SHUT_WR)
        self.do_kick()

    def close(self):
        self.map.close()
        for fd in (self.memfd, self.life, self.kick, self.wake):
            os.close(fd)


def connect(path, node, port, ring_size=0, qps=0, timeout=30, numa=None, caller_node=None, rail=None):
    """caller_node: the NUMA node to report as the connecting thread's (libmesh asks getcpu)."""
    s = _open(path)
    hint = {} if numa is None else dict(has_numa=1, numa_node=numa)
    if caller_node is not None:
        hint.update(has_caller_node=1, caller_node=caller_node)
    if rail is not None:
        hint.update(has_rail=1, rail=rail)
    try:
        s.send(encode_request(version=CTL_VERSION, op=OP_CONNECT, node=node, port=port, ring_size=ring_size,
                              qps=qps, **hint))
        return Channel(_recv_reply(s, timeout))
    finally:
        s.close()


def connect_reply(path, node, port, **kw):
    """The raw reply of a CONNECT (for error cases)."""
    s = _open(path)
    try:
        s.send(encode_request(version=CTL_VERSION, op=OP_CONNECT, node=node, port=port, **kw))
        r = _recv_reply(s)
        for fd in r.fds:
            os.close(fd)
        return r
    finally:
        s.close()


class Listener:
    def __init__(self, path, port):
        self.sock = _open(path)
        self.sock.send(encode_request(version=CTL_VERSION, op=OP_LISTEN, port=port))
        r = _recv_reply(self.sock)
        if r.status:
            self.sock.close()
            raise OSError(-r.status, f"meshd: {r.error}")

    def accept(self, timeout=30):
        return Channel(_recv_reply(self.sock, timeout))

    def close(self):
        self.sock.close()


def channels(path):
    s = _open(path)
    try:
        s.send(encode_request(version=CTL_VERSION, op=0, object=OBJ_CHANNELS))
        return _recv_reply(s).channels
    finally:
        s.close()
