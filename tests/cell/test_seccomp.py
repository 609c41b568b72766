"""The seccomp filters: their program, read by a small classic-BPF interpreter, and
their effect on the real kernel, in a forked child that loads them and reports
back through a pipe.

Each refused call is made with arguments that make the unfiltered kernel fail
with some error other than EPERM (or succeed harmlessly), so that EPERM can only
come from the filter; the same call in ``audit`` mode must get the kernel's own
answer. Each refusal is paired with a legitimate neighbour that must still work.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import select
import signal
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stockade.cell import _seccomp as seccomp
from stockade.cell._syscall import set_no_new_privs, syscall
from stockade.cell._syscall_table import AUDIT_ARCH_X86_64, SYSCALLS, X32_SYSCALL_BIT
from stockade.errors import HostError
from tests.cell._child import run_in_child

AUDIT_ARCH_I386 = 0x4000_0003
RET_EPERM = seccomp.SECCOMP_RET_ERRNO | errno.EPERM
RET_ENOSYS = seccomp.SECCOMP_RET_ERRNO | errno.ENOSYS
ALLOW = seccomp.SECCOMP_RET_ALLOW
RET_EAFNOSUPPORT = seccomp.SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT


def _socket_refusal(args: tuple[int, ...]) -> int:
    """A netlink socket is refused as a kernel without netlink would (so that
    audit-aware tools carry on), any other socket with EPERM."""
    return RET_EAFNOSUPPORT if args[0] & 0xFFFF_FFFF == socket.AF_NETLINK else RET_EPERM
LOG = seccomp.SECCOMP_RET_LOG
KILL = seccomp.SECCOMP_RET_KILL_PROCESS

# --- a classic BPF interpreter for the instructions the filters use ----------------


def trace_bpf(
    program: bytes, nr: int, arch: int = AUDIT_ARCH_X86_64, args: tuple[int, ...] = ()
) -> tuple[int, int, bool]:
    """Run a seccomp program over one struct seccomp_data; return its action, the
    number of instructions walked and whether it read a syscall argument."""
    full_args = (*args, *([0] * (6 - len(args))))
    data = struct.pack("<iIQ6Q", nr, arch, 0, *[a & (2**64 - 1) for a in full_args])
    insns = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    acc = 0
    pc = 0
    steps = 0
    read_args = False
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        steps += 1
        if code == seccomp.BPF_LD_W_ABS:
            assert k % 4 == 0 and k + 4 <= len(data), f"load out of seccomp_data at {k}"
            (acc,) = struct.unpack_from("<I", data, k)
            read_args |= k >= 16
        elif code == seccomp.BPF_ALU_AND_K:
            acc &= k
        elif code == seccomp.BPF_JMP_JEQ_K:
            pc += jt if acc == k else jf
        elif code == seccomp.BPF_JMP_JGE_K:
            pc += jt if acc >= k else jf
        elif code == seccomp.BPF_JMP_JSET_K:
            pc += jt if acc & k else jf
        elif code == seccomp.BPF_RET_K:
            return int(k), steps, read_args
        else:
            raise AssertionError(f"unexpected BPF opcode {code:#x}")


def run_bpf(program: bytes, nr: int, arch: int = AUDIT_ARCH_X86_64, args: tuple[int, ...] = ()) -> int:
    """The action of a seccomp program for one struct seccomp_data."""
    return trace_bpf(program, nr, arch, args)[0]


def decide(mode: seccomp.Mode, nr: int, arch: int = AUDIT_ARCH_X86_64, args: tuple[int, ...] = ()) -> int:
    """The action of the stacked filters: the most restrictive one wins."""
    deny, clone3 = seccomp.build_filters(mode)
    actions = [run_bpf(deny, nr, arch, args), run_bpf(clone3, nr, arch, args)]
    # Kernel precedence: KILL_PROCESS > ERRNO > LOG > ALLOW (seccomp(2), "Filter return values").
    order = [KILL, seccomp.SECCOMP_RET_ERRNO, LOG, ALLOW]
    return min(actions, key=lambda a: order.index(a & 0xFFFF_0000 if a != KILL else KILL))


def refused_reference(name: str, args: tuple[int, ...]) -> bool:
    """What the filter should refuse, written independently of its program."""
    low = [a & 0xFFFF_FFFF for a in (*args, *([0] * (6 - len(args))))]
    if name == "socket":
        domain, kind, proto = low[0], low[1] & 0xF, low[2]
        if kind == 3:
            return True
        if domain == 1:
            return kind == 2
        if domain in (2, 10):
            return not (kind == 1 and proto in (0, 6))
        return True
    if name == "ioctl":
        return low[1] in (0x5412, 0x541C)
    if name == "clone":
        return bool(low[0] & 0x7E02_0000)
    if name == "personality":
        return low[0] not in (0, 0xFFFF_FFFF)
    return name in seccomp.ALWAYS_REFUSED


class TestProgram:
    @pytest.mark.parametrize("mode", ["enforce", "audit"])
    def test_starts_with_the_architecture_check(self, mode: seccomp.Mode) -> None:
        deny = seccomp.build_filter(mode)
        first = struct.unpack_from("=HBBI", deny, 0)
        second = struct.unpack_from("=HBBI", deny, 8)
        assert first == (seccomp.BPF_LD_W_ABS, 0, 0, 4)
        assert second[0] == seccomp.BPF_JMP_JEQ_K and second[3] == AUDIT_ARCH_X86_64
        assert second[1] == 0  # on match fall through to the syscall checks

    def test_foreign_architecture_kills_in_enforce_and_logs_in_audit(self) -> None:
        for nr in (0, 20, 39, 56, 101, 435):
            assert decide("enforce", nr, AUDIT_ARCH_I386) == KILL
            assert decide("audit", nr, AUDIT_ARCH_I386) == LOG
        assert decide("enforce", 39) == ALLOW  # getpid on x86-64: the neighbour

    @pytest.mark.parametrize("mode,expected", [("enforce", RET_EPERM), ("audit", LOG)])
    def test_x32_calls_are_refused(self, mode: seccomp.Mode, expected: int) -> None:
        for nr in (0, 39, 59, 512, 547):
            assert decide(mode, nr | X32_SYSCALL_BIT) == expected

    @pytest.mark.parametrize("mode,expected", [("enforce", RET_EPERM), ("audit", LOG)])
    def test_every_always_refused_syscall(self, mode: seccomp.Mode, expected: int) -> None:
        for name in seccomp.ALWAYS_REFUSED:
            assert decide(mode, SYSCALLS[name]) == expected, name

    def test_everything_else_is_allowed_by_number(self) -> None:
        conditional = set(seccomp._CONDITIONAL)
        for name, nr in SYSCALLS.items():
            if name in seccomp.ALWAYS_REFUSED or name in conditional:
                continue
            assert decide("enforce", nr, args=(1, 2, 3, 4, 5, 6)) == ALLOW, name

    @pytest.mark.parametrize(("name", "arg"), sorted(seccomp.MODE_ARG.items()))
    def test_set_id_modes_are_refused_and_plain_modes_allowed(self, name: str, arg: int) -> None:
        nr = SYSCALLS[name]
        plain = [0] * 6
        plain[arg] = 0o755
        setuid = list(plain)
        setuid[arg] = 0o4755
        setgid = list(plain)
        setgid[arg] = 0o2755
        assert decide("enforce", nr, args=tuple(plain)) == ALLOW
        assert decide("enforce", nr, args=tuple(setuid)) == RET_EPERM
        assert decide("enforce", nr, args=tuple(setgid)) == RET_EPERM
        # Only the low 32 bits hold a mode; high bits set change nothing.
        setuid[arg] |= 1 << 40
        assert decide("enforce", nr, args=tuple(setuid)) == RET_EPERM

    def test_openat2_is_enosys_unlogged(self) -> None:
        assert decide("enforce", SYSCALLS["openat2"]) == RET_ENOSYS

    def test_allowed_syscalls_are_decided_by_number_in_few_steps(self) -> None:
        # Read no argument: the kernel's action cache then skips the filter for
        # them. Few steps: the numbers are searched as a tree, not a list.
        deny, clone3 = seccomp.build_filters("enforce")
        conditional = set(seccomp._CONDITIONAL)
        for name, nr in SYSCALLS.items():
            _, steps, read_args = trace_bpf(deny, nr, args=(socket.AF_INET6, socket.SOCK_STREAM, 6))
            if name in conditional:
                assert steps <= 28, (name, steps)
            else:
                assert steps <= 12 and not read_args, (name, steps)
            assert not trace_bpf(clone3, nr)[2]
        assert len(deny) // 8 < 200  # well inside the 8-bit jump offsets the assembler relaxes

    def test_clone3_is_enosys_in_both_modes(self) -> None:
        assert decide("enforce", SYSCALLS["clone3"]) == RET_ENOSYS
        assert decide("audit", SYSCALLS["clone3"]) == RET_ENOSYS
        _, clone3 = seccomp.build_filters("enforce")
        assert run_bpf(clone3, SYSCALLS["clone3"], AUDIT_ARCH_I386) == ALLOW  # deny filter kills
        assert run_bpf(clone3, SYSCALLS["clone"]) == ALLOW

    def test_refused_names_are_real_syscalls(self) -> None:
        assert set(seccomp.REFUSED) <= set(SYSCALLS)
        assert all(reason and "\n" not in reason for reason in seccomp.REFUSED.values())
        for name in seccomp.REFUSED:
            assert seccomp.refusal_reason(SYSCALLS[name]) == seccomp.REFUSED[name]
        assert seccomp.refusal_reason(SYSCALLS["read"]) is None
        assert seccomp.refusal_reason(39 | X32_SYSCALL_BIT) == seccomp.X32_REASON
        assert seccomp.refusal_reason(20, AUDIT_ARCH_I386) == seccomp.FOREIGN_ARCH_REASON

    def test_every_refusal_is_documented(self) -> None:
        doc = (Path(__file__).parents[2] / "docs" / "KERNEL.md").read_text()
        table = doc[doc.index("### What is refused, and why") :]
        assert [name for name in seccomp.REFUSED if f"`{name}`" not in table] == []

    @pytest.mark.parametrize(
        "args,refused",
        [
            ((socket.AF_INET, socket.SOCK_STREAM, 0), False),
            ((socket.AF_INET6, socket.SOCK_STREAM | socket.SOCK_CLOEXEC, 6), False),
            # A unix datagram socket sends to any path without connect(2), where
            # the connect supervisor decides: refused. Stream and seqpacket connect.
            ((socket.AF_UNIX, socket.SOCK_DGRAM, 0), True),
            ((socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, 0), True),
            ((socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK, 0), False),
            ((socket.AF_UNIX, socket.SOCK_SEQPACKET, 0), False),
            ((socket.AF_INET, socket.SOCK_DGRAM, 0), True),
            ((socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK, 17), True),
            ((socket.AF_INET, socket.SOCK_STREAM, 132), True),  # SCTP: not covered by Landlock
            ((socket.AF_INET, socket.SOCK_STREAM, 262), True),  # MPTCP
            ((socket.AF_INET, socket.SOCK_RAW, 1), True),
            ((socket.AF_UNIX, socket.SOCK_RAW, 0), True),
            ((17, socket.SOCK_RAW, 0), True),  # AF_PACKET
            ((16, socket.SOCK_RAW, 0), True),  # AF_NETLINK
            ((16, socket.SOCK_DGRAM, 0), True),
            ((40, socket.SOCK_STREAM, 0), True),  # AF_VSOCK: reaches the hypervisor, no netns
            ((38, socket.SOCK_SEQPACKET, 0), True),  # AF_ALG
            (((1 << 32) | 17, socket.SOCK_RAW, 0), True),  # high bits do not hide AF_PACKET
            (((1 << 32) | socket.AF_INET, (1 << 40) | socket.SOCK_STREAM, 0), False),
        ],
    )
    def test_socket_arguments(self, args: tuple[int, ...], refused: bool) -> None:
        action = decide("enforce", SYSCALLS["socket"], args=args)
        assert action == (_socket_refusal(args) if refused else ALLOW)
        assert refused_reference("socket", args) is refused

    @given(
        name=st.sampled_from(["socket", "ioctl", "clone", "personality"]),
        args=st.tuples(*[st.integers(0, 2**64 - 1)] * 3),
        small=st.tuples(st.sampled_from([0, 1, 2, 3, 10, 16, 17, 40]), st.integers(0, 15)),
    )
    def test_argument_checks_match_the_reference(
        self, name: str, args: tuple[int, int, int], small: tuple[int, int]
    ) -> None:
        # Random 64-bit words, and small domain/type values so that the allowed
        # branches are reached as well.
        for candidate in (args, (small[0], small[1], args[2] & 7)):
            refusal = _socket_refusal(candidate) if name == "socket" else RET_EPERM
            expected = refusal if refused_reference(name, candidate) else ALLOW
            assert decide("enforce", SYSCALLS[name], args=candidate) == expected

    @pytest.mark.parametrize(
        "args,refused",
        [
            ((0, 0x5412), True),
            ((0, 0x541C), True),
            ((0, (1 << 32) | 0x5412), True),  # the kernel truncates the request to 32 bits
            ((0, 0x5413), False),  # TIOCGWINSZ
            ((0, 0x5401), False),  # TCGETS
        ],
    )
    def test_ioctl_arguments(self, args: tuple[int, ...], refused: bool) -> None:
        assert decide("enforce", SYSCALLS["ioctl"], args=args) == (RET_EPERM if refused else ALLOW)

    def test_clone_flags(self) -> None:
        thread = 0x3D0F00  # glibc's pthread_create flags
        fork = 0x01200011  # CLONE_CHILD_SETTID | CLONE_CHILD_CLEARTID | SIGCHLD
        assert decide("enforce", SYSCALLS["clone"], args=(thread,)) == ALLOW
        assert decide("enforce", SYSCALLS["clone"], args=(fork,)) == ALLOW
        for bit in range(32):
            flag = 1 << bit
            expected = RET_EPERM if flag & seccomp.CLONE_NEW_FLAGS else ALLOW
            assert decide("enforce", SYSCALLS["clone"], args=(fork | flag,)) == expected

    def test_personality(self) -> None:
        nr = SYSCALLS["personality"]
        assert decide("enforce", nr, args=(0,)) == ALLOW
        assert decide("enforce", nr, args=(0xFFFF_FFFF,)) == ALLOW
        assert decide("enforce", nr, args=(0x0040_0000,)) == RET_EPERM  # READ_IMPLIES_EXEC
        assert decide("enforce", nr, args=(0x0004_0000,)) == RET_EPERM  # ADDR_NO_RANDOMIZE
        assert decide("audit", nr, args=(0x0004_0000,)) == LOG

    def test_built_once_per_mode(self) -> None:
        assert seccomp.build_filters("enforce") is seccomp.build_filters("enforce")
        assert seccomp.build_filters("enforce")[0] != seccomp.build_filters("audit")[0]


# --- the real kernel ----------------------------------------------------------------


def attempt(nr: int, *args: int | bytes) -> int:
    """errno of syscall ``nr``, or 0 when it succeeded (closing any fd it returned)."""
    try:
        result = syscall(nr, *args)
    except OSError as exc:
        assert exc.errno is not None
        return exc.errno
    if nr in (SYSCALLS["socket"], SYSCALLS["userfaultfd"], SYSCALLS["open_tree"]) and result > 2:
        os.close(result)
    return 0


def filtered(mode: seccomp.Mode | None, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a child under the filters of ``mode`` (None: no filter)."""

    def child() -> Any:
        set_no_new_privs()
        if mode is not None:
            seccomp.apply(seccomp.build_filters(mode))
        return fn()

    return run_in_child(child)


MISSING = b"/nonexistent-stockade-test"
BAD_FD = -1
NO_PID = 0x3FFF_FFFF  # above pid_max

# Arguments that make the unfiltered kernel fail harmlessly with an error other
# than EPERM (checked by test_unfiltered_kernel_does_not_answer_eperm).
REFUSED_CALLS: dict[str, tuple[int | bytes, ...]] = {
    "ptrace": (2, NO_PID, 0, 0),  # PTRACE_PEEKDATA, no such process: ESRCH
    "process_vm_readv": (NO_PID, 0, 0, 0, 0, 1),  # flags must be 0: EINVAL
    "process_vm_writev": (NO_PID, 0, 0, 0, 0, 1),
    "pidfd_getfd": (BAD_FD, 0, 0),
    "process_madvise": (BAD_FD, 0, 0, 0, 0),
    "unshare": (0,),  # no flags: succeeds, changes nothing
    "setns": (BAD_FD, 0),
    "mount": (0, 0, 0, 0, 0),
    "umount2": (MISSING, 0),
    "pivot_root": (0, 0),
    "chroot": (MISSING,),
    "move_mount": (BAD_FD, MISSING, BAD_FD, MISSING, 0),
    "open_tree": (BAD_FD, MISSING, 0),
    "open_tree_attr": (BAD_FD, MISSING, 0, 0, 0),
    "fsopen": (b"no-such-filesystem", 0),
    "fsconfig": (BAD_FD, 0, 0, 0, 0),
    "fsmount": (BAD_FD, 0, 0),
    "fspick": (BAD_FD, MISSING, 0),
    "mount_setattr": (BAD_FD, MISSING, 0, 0, 0),
    "bpf": (-1, 0, 0),
    "perf_event_open": (0, 0, -1, -1, 0),
    "io_uring_setup": (0, 0),
    "io_uring_enter": (BAD_FD, 0, 0, 0, 0, 0),
    "io_uring_register": (BAD_FD, 0, 0, 0),
    "userfaultfd": (-1,),  # unknown flags: EINVAL
    "keyctl": (-1, 0, 0, 0, 0),
    "add_key": (0, 0, 0, 0, 0),
    "request_key": (0, 0, 0, 0),
    "init_module": (0, 0, 0),
    "finit_module": (BAD_FD, 0, 0),
    "delete_module": (b"stockade_no_such_module", 0),
    "kexec_load": (0, 0, 0, 0x8000),  # unknown flag: EINVAL
    "kexec_file_load": (BAD_FD, BAD_FD, 0, 0, 0x8000),
    "reboot": (0, 0, 0, 0),  # wrong magic: EINVAL
    "swapon": (MISSING, 0),
    "swapoff": (MISSING,),
    "settimeofday": (1, 0),  # bad pointer: EFAULT
    "clock_settime": (-1, 0),
    "clock_adjtime": (-1, 0),
    "adjtimex": (0,),
    "open_by_handle_at": (BAD_FD, 0, 0),
    "name_to_handle_at": (BAD_FD, 0, 0, 0, 0),
    "acct": (MISSING,),
    "quotactl": (0, 0, 0, 0),
    "quotactl_fd": (BAD_FD, 0, 0, 0),
    "lookup_dcookie": (0, 0, 0),
}

CONDITIONAL_CALLS: dict[str, tuple[str, tuple[int | bytes, ...]]] = {
    "ioctl TIOCSTI": ("ioctl", (BAD_FD, seccomp.TIOCSTI, 0)),
    "ioctl TIOCLINUX": ("ioctl", (BAD_FD, seccomp.TIOCLINUX, 0)),
    "ioctl TIOCSTI, high bits set": ("ioctl", (BAD_FD, (1 << 32) | seccomp.TIOCSTI, 0)),
    "socket AF_PACKET": ("socket", (17, socket.SOCK_RAW, 0)),
    "socket AF_NETLINK": ("socket", (16, socket.SOCK_RAW, 0)),
    "socket AF_INET SOCK_RAW": ("socket", (socket.AF_INET, socket.SOCK_RAW, 1)),
    "socket AF_INET SOCK_DGRAM": ("socket", (socket.AF_INET, socket.SOCK_DGRAM, 0)),
    "socket AF_INET6 SOCK_DGRAM|NONBLOCK|CLOEXEC": (
        "socket",
        (socket.AF_INET6, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC, 0),
    ),
    "socket AF_VSOCK": ("socket", (40, socket.SOCK_STREAM, 0)),
    "personality READ_IMPLIES_EXEC": ("personality", (0x0040_0000,)),
    # CLONE_SIGHAND without CLONE_VM: the unfiltered kernel answers EINVAL, no child.
    **{
        f"clone {flag}": ("clone", (value | 0x800, 0, 0, 0, 0))
        for flag, value in [
            ("CLONE_NEWNS", 0x0002_0000),
            ("CLONE_NEWCGROUP", 0x0200_0000),
            ("CLONE_NEWUTS", 0x0400_0000),
            ("CLONE_NEWIPC", 0x0800_0000),
            ("CLONE_NEWUSER", 0x1000_0000),
            ("CLONE_NEWPID", 0x2000_0000),
            ("CLONE_NEWNET", 0x4000_0000),
        ]
    },
}


def _all_refused_attempts() -> dict[str, int]:
    results = {name: attempt(SYSCALLS[name], *args) for name, args in REFUSED_CALLS.items()}
    for label, (name, args) in CONDITIONAL_CALLS.items():
        results[label] = attempt(SYSCALLS[name], *args)
    results["x32 getpid"] = attempt(SYSCALLS["getpid"] | X32_SYSCALL_BIT)
    return results


@pytest.fixture(scope="module")
def unfiltered() -> dict[str, int]:
    result: dict[str, int] = filtered(None, _all_refused_attempts)
    return result


class TestKernel:
    def test_every_refused_syscall_is_exercised(self) -> None:
        assert set(REFUSED_CALLS) == set(seccomp.ALWAYS_REFUSED)
        assert {name for name, _ in CONDITIONAL_CALLS.values()} == {
            "ioctl",
            "socket",
            "personality",
            "clone",
        }

    def test_host_logs_refusals(self) -> None:
        seccomp.check_host("enforce")
        seccomp.check_host("audit")

    @pytest.mark.skipif(os.geteuid() != 0, reason="as non-root the kernel itself answers EPERM")
    def test_unfiltered_kernel_does_not_answer_eperm(self, unfiltered: dict[str, int]) -> None:
        # Otherwise an EPERM under the filter would prove nothing.
        eperm = sorted(label for label, err in unfiltered.items() if err == errno.EPERM)
        assert eperm == []

    def test_enforce_refuses_each_with_eperm(self) -> None:
        results = filtered("enforce", _all_refused_attempts)
        # Netlink as a kernel without it: shadow's useradd carries on then.
        expected = {label: errno.EAFNOSUPPORT for label in results if "NETLINK" in label}
        assert {label: err for label, err in results.items() if err != errno.EPERM} == expected
        assert expected

    def test_audit_lets_each_through(self, unfiltered: dict[str, int]) -> None:
        results = filtered("audit", _all_refused_attempts)
        assert results == unfiltered

    def test_neighbours_still_work(self) -> None:
        def neighbours() -> dict[str, Any]:
            out: dict[str, Any] = {}
            pid = os.fork()
            if pid == 0:
                os._exit(7)
            out["fork"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            seen: list[int] = []
            thread = threading.Thread(target=lambda: seen.append(threading.get_native_id()))
            thread.start()
            thread.join(5)
            out["thread"] = bool(seen) and seen[0] != threading.get_native_id()
            for label, family, kind in [
                ("tcp4", socket.AF_INET, socket.SOCK_STREAM),
                ("tcp6", socket.AF_INET6, socket.SOCK_STREAM),
                ("unix stream", socket.AF_UNIX, socket.SOCK_STREAM),
                ("unix seqpacket", socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC),
            ]:
                socket.socket(family, kind).close()
                out[label] = True
            a, b = socket.socketpair()
            a.send(b"x")
            out["socketpair"] = b.recv(1) == b"x"
            a.close()
            b.close()
            out["ioctl TIOCGWINSZ"] = attempt(SYSCALLS["ioctl"], BAD_FD, 0x5413, 0)
            out["personality query"] = syscall(SYSCALLS["personality"], 0xFFFF_FFFF)
            out["personality PER_LINUX"] = attempt(SYSCALLS["personality"], 0)
            out["getpid"] = syscall(SYSCALLS["getpid"]) == os.getpid()
            return out

        results = filtered("enforce", neighbours)
        assert results == {
            "fork": 7,
            "thread": True,
            "tcp4": True,
            "tcp6": True,
            "unix stream": True,
            "unix seqpacket": True,
            "socketpair": True,
            "ioctl TIOCGWINSZ": errno.EBADF,
            "personality query": 0,
            "personality PER_LINUX": 0,
            "getpid": True,
        }

    def test_clone3_fails_with_enosys_and_threads_fall_back(self) -> None:
        def clone3() -> tuple[int, int]:
            # A NULL clone_args with size 0 is EINVAL unfiltered; ENOSYS only from the filter.
            return attempt(SYSCALLS["clone3"], 0, 0), attempt(SYSCALLS["clone3"], 0, 0)

        assert filtered(None, clone3) == (errno.EINVAL, errno.EINVAL)
        assert filtered("enforce", clone3) == (errno.ENOSYS, errno.ENOSYS)
        assert filtered("audit", clone3) == (errno.ENOSYS, errno.ENOSYS)

    def _i386_getpid(self) -> tuple[int, int]:
        # mov eax, 20 (getpid in the i386 table); int 0x80; ret
        code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        function = ctypes.CFUNCTYPE(ctypes.c_int)(address)
        return function(), os.getpid()

    def test_foreign_architecture_kills_the_process(self) -> None:
        got, pid = filtered(None, self._i386_getpid)
        if got != pid:
            pytest.skip("host lacks IA32 emulation (int 0x80 does not reach the i386 table)")
        got, pid = filtered("audit", self._i386_getpid)
        assert got == pid  # audit mode: logged, let through

        def under_enforce() -> None:
            seccomp.apply(seccomp.build_filters("enforce"))
            self._i386_getpid()
            os._exit(0)

        # The child holds the write end of a pipe: its end, however it comes,
        # shows as EOF on the read end.
        read_end, write_end = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - the child
            try:
                os.close(read_end)
                set_no_new_privs()
                under_enforce()
            finally:
                os._exit(1)
        os.close(write_end)
        try:
            ended, _, _ = select.select([read_end], [], [], 20)
            if not ended:
                os.kill(child, signal.SIGKILL)
        finally:
            os.close(read_end)
        _, status = os.waitpid(child, 0)
        assert ended, "child under the filter neither died nor exited"
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS


class TestCheckHost:
    def test_missing_errno_logging_is_a_host_error(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        (tmp_path / "actions_avail").write_text("kill_process kill_thread errno log allow\n")
        (tmp_path / "actions_logged").write_text("kill_process kill_thread log\n")
        monkeypatch.setattr(seccomp, "_SECCOMP_PROC", str(tmp_path))
        with pytest.raises(HostError) as info:
            seccomp.check_host("enforce")
        assert info.value.feature == "seccomp.log"
        assert "errno" in str(info.value) and "actions_logged" in str(info.value)
        seccomp.check_host("audit")  # audit mode needs only "log"

    def test_missing_seccomp_is_a_host_error(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(seccomp, "_SECCOMP_PROC", str(tmp_path / "absent"))
        with pytest.raises(HostError) as info:
            seccomp.check_host("audit")
        assert info.value.feature == "seccomp"
