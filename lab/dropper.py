"""Kernel random drop for the lab's links: a tcx eBPF program, assembled here and loaded with bpf(2).

The program drops each packet with the profile's probability (``bpf_get_prandom_u32() <
p * 2**32``) and passes the rest; a partition (``down``) drops everything. It is attached
at tcx *ingress* of a link's receiving device, so the loss falls after the bottleneck and
the delay line, on MTU-sized packets, like loss on a real path. The attachment is a BPF
link (``BPF_LINK_CREATE``, Linux 6.6+) that lives as long as its file descriptor: the lab
process holds it, and a lab that dies leaves nothing attached. No compiler, ``nft`` or
``iptables`` is needed (this host has none); a profile change swaps the program in place
(``BPF_LINK_UPDATE``). See docs/lab.md.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import struct
import threading

logger = logging.getLogger(__name__)

SYS_BPF = 321
"""x86_64 syscall number of bpf(2)."""
BPF_PROG_LOAD = 5
BPF_LINK_CREATE = 28
BPF_LINK_UPDATE = 29
BPF_PROG_TYPE_SCHED_CLS = 3
BPF_TCX_INGRESS = 46
CLONE_NEWNET = 0x40000000
TC_ACT_OK = 0
TC_ACT_SHOT = 2
HELPER_GET_PRANDOM_U32 = 7

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.syscall.restype = ctypes.c_long
_setns_lock = threading.Lock()


class DropperError(OSError):
    """The kernel refused the program or its attachment."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def assemble(loss: float) -> bytes:
    """Instructions of the program that drops with probability ``loss`` (0..1)."""
    if not 0.0 <= loss <= 1.0:
        raise ValueError(f"invalid loss: {loss!r}")
    mov64_imm, call, exit_, jlt_imm, ld_imm64, jlt_reg = 0xB7, 0x85, 0x95, 0xA5, 0x18, 0xAD
    r0, r2 = 0, 2
    if loss <= 0.0 or loss >= 1.0:
        return _insn(mov64_imm, r0, imm=TC_ACT_SHOT if loss else TC_ACT_OK) + _insn(exit_)
    threshold = min(round(loss * 2**32), 2**32 - 1)
    pass_ = [_insn(mov64_imm, r0, imm=TC_ACT_OK), _insn(exit_)]
    code = [_insn(call, imm=HELPER_GET_PRANDOM_U32)]
    if threshold < 2**31:  # the immediate is sign-extended: small thresholds fit it
        code += [_insn(jlt_imm, r0, off=len(pass_), imm=threshold)]
    else:
        wide = _insn(ld_imm64, r2, imm=threshold - 2**32) + _insn(0)  # two slots: low, high 0
        code += [wide, _insn(jlt_reg, r0, r2, off=len(pass_))]
    return b"".join([*code, *pass_, _insn(mov64_imm, r0, imm=TC_ACT_SHOT), _insn(exit_)])


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    fd = _libc.syscall(SYS_BPF, cmd, attr, ctypes.sizeof(attr))
    if fd < 0:
        err = ctypes.get_errno()
        raise DropperError(err, f"bpf(cmd={cmd}): {os.strerror(err)}")
    return int(fd)


def load(loss: float) -> int:
    """Load the drop program for ``loss``; its file descriptor (close it when done)."""
    insns = assemble(loss)
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(16384)
    attr = ctypes.create_string_buffer(128)
    # union bpf_attr for BPF_PROG_LOAD: prog_type, insn_cnt, insns, license, log_level,
    # log_size, log_buf, kern_version, prog_flags, prog_name[16].
    struct.pack_into(
        "<IIQQIIQII16s",
        attr,
        0,
        BPF_PROG_TYPE_SCHED_CLS,
        len(insns) // 8,
        ctypes.addressof(code),
        ctypes.addressof(lic),
        1,
        len(log),
        ctypes.addressof(log),
        0,
        0,
        b"skyfed_drop",
    )
    try:
        return _bpf(BPF_PROG_LOAD, attr)
    except DropperError as exc:
        raise DropperError(exc.errno, f"{exc.strerror}; verifier: {log.value.decode()}") from None


class Dropper:
    """The drop program attached at tcx ingress of one device; ``close`` detaches it."""

    def __init__(self, netns_path: str, dev: str, loss: float) -> None:
        self.dev = dev
        self.loss = loss
        self._prog = load(loss)
        try:
            self._link = _attach_ingress(netns_path, dev, self._prog)
        except BaseException:
            os.close(self._prog)
            raise

    def set_loss(self, loss: float) -> None:
        """Swap in the program for ``loss`` without a moment unattached."""
        prog = load(loss)
        attr = ctypes.create_string_buffer(64)
        struct.pack_into("<IIII", attr, 0, self._link, prog, 0, 0)
        try:
            _bpf(BPF_LINK_UPDATE, attr)
        except BaseException:
            os.close(prog)
            raise
        os.close(self._prog)
        self._prog, self.loss = prog, loss

    def close(self) -> None:
        """Detach (closing the link's last descriptor detaches it) and free the program."""
        for fd in (self._link, self._prog):
            if fd >= 0:
                os.close(fd)
        self._link = self._prog = -1


def _attach_ingress(netns_path: str, dev: str, prog_fd: int) -> int:
    with _setns_lock:  # setns moves only this thread; the lock keeps others out meanwhile
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(netns_path, os.O_RDONLY)
        try:
            if _libc.setns(target, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns({netns_path})")
            ifindex = _libc.if_nametoindex(dev.encode())
            if ifindex == 0:
                raise OSError(ctypes.get_errno(), f"no device {dev!r} in {netns_path}")
            attr = ctypes.create_string_buffer(64)
            struct.pack_into("<IIII", attr, 0, prog_fd, ifindex, BPF_TCX_INGRESS, 0)
            return _bpf(BPF_LINK_CREATE, attr)
        finally:
            if _libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns(home)")
            os.close(target)
            os.close(home)
