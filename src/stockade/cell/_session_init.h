/*
 * The session mode of the cell's init (C2), included by _native.c.
 *
 * Why in the init, in C: a workbench's image may hold no Python, no shell,
 * nothing of ours, so whatever starts each call inside the cell must already
 * be in memory there. The init is: it built the view, it is inside every layer
 * (Landlock domain, seccomp, no capabilities, the cgroups, the namespaces), and
 * every process it forks inherits all of that. So instead of forking one
 * command, an init in session mode serves requests from the host
 * (stockade.cell._session) on a SOCK_SEQPACKET socket, one message each:
 *
 *   "X\0<uid>\0<gid>\0<cwd>\0<argc>\0<argv...>\0<env...>\0"   run a command
 *   "O\0<uid>\0<gid>\0<path>\0<flags>\0<mode>\0"              open a file
 *
 * with descriptors attached (SCM_RIGHTS): for "X" the call's stdin, stdout,
 * stderr and its control socket; for "O" the control socket alone. For each
 * request the init starts a child (clone(CLONE_VM | CLONE_VFORK) on a stack
 * of the init's own) that takes the call's ids, enters a process
 * group of its own and says "S" on the control socket; the host, which set
 * SO_PASSCRED there, reads the child's host pid from the credentials the
 * kernel attaches (translated out of the cell's pid namespace), moves it into
 * a cgroup of the call's own (so that a timeout kills the call's whole tree,
 * double-forked daemons included) and answers "G"; only then does the child
 * chdir and exec. An "O" child opens the path as the call's user, inside the
 * cell's view, and sends the descriptor back ("F", then "D" once it let go
 * of it), so permissions, symlinks and mounts mean what they mean inside;
 * what may wait at its open (a fifo, a device) it opens in a fork of its own
 * (session_open_child). When a child ends, the init reports
 * "W<wait status>\n" on its control socket and closes it; a step that failed
 * is "E<stage>\t<errno>\t<message>\n" from the child first (die()).
 *
 * The init ends (and the kernel with it every process of the cell) when the
 * host closes its end of the session socket. Like the rest of the children it
 * makes only syscalls: no malloc, no stdio, buffers on the stack or mmap'd.
 *
 * Why no fork per call: the init is a clone of the process that launched the
 * cell and never execs, so it starts with that process's whole memory (an
 * eval's interpreter: 90-300 MiB; it lets go of most of it between its first
 * calls, session_plan_drops), and a fork copies the page tables of all of it: a
 * 4 KiB read_file took 10-12 ms and an exec of /bin/true 33-37 ms from an
 * 86 MiB launcher, against 2 and 5 ms from 20 MiB
 * (benchmarks/session_fork_size.py, docs/PERFORMANCE.md). A child that
 * shares the init's memory until its execve or _exit copies none, as
 * CPython's vfork spawn does; an open that may block for good (a fifo with
 * no writer) is the one thing such a child must not do, since the init must
 * stay free to end the cell: that open alone is forked, at the old cost.
 * The price: the init sleeps while a child gets
 * ready, handshake included, so calls start one at a time (they still run
 * at once); a host that never answers "G" would stall the session, so the
 * child waits for it at most SESSION_GO_TIMEOUT_MS. Such a child makes only
 * syscalls that touch no memory the init relies on: its own stack, reads of
 * the request, its own descriptor table and credentials (no CLONE_FILES, no
 * CLONE_THREAD: setresuid is the child's alone).
 */
#include <poll.h>
#include <sys/signalfd.h>

#define SESSION_MAX_REQUEST (1u << 20) /* _session.MAX_REQUEST: argv, env and cwd of one call */
#define SESSION_MAX_CALLS 1024         /* calls in flight at once; more is refused (EAGAIN) */
#define SESSION_MAX_STRINGS (SESSION_MAX_REQUEST / 2)
#define SESSION_GO_TIMEOUT_MS 30000    /* _session.START_TIMEOUT: the host's "G" after "S" */

struct session_call {
    pid_t pid;
    int ctl;
};

static const char ST_SESSION[] = "serving the session";
static const char ST_USER[] = "taking the call's user";
static const char ST_CWD[] = "entering the call's cwd";
static const char ST_OPEN[] = "opening the file";

/* The next NUL-terminated field of a request, or NULL past its end. */
static const char *session_field(const char **at, const char *end) {
    const char *start = *at, *nul;
    if (start >= end) return NULL;
    nul = memchr(start, '\0', (size_t)(end - start));
    if (nul == NULL) return NULL;
    *at = nul + 1;
    return start;
}

static int session_number(const char *text, long lo, long hi, long *out) {
    long value = 0;
    int negative = 0;
    if (text == NULL || *text == '\0') return -1;
    if (*text == '-') {
        negative = 1;
        text++;
    }
    for (; *text; text++) {
        if (*text < '0' || *text > '9' || value > (LONG_MAX - 9) / 10) return -1;
        value = value * 10 + (*text - '0');
    }
    if (negative) value = -value;
    if (value < lo || value > hi) return -1;
    *out = value;
    return 0;
}

/* The child's side of both kinds of request: the call's ids, a process group,
 * "S" with the credentials, and the host's "G". */
static void session_enter(int ctl, long uid, long gid) {
    char go;
    ssize_t got;
    if (setpgid(0, 0) < 0) die(ctl, ST_PREPARING, errno, "setpgid of the call", NULL);
    /* A change of user needs CAP_SETUID/CAP_SETGID in the cell's namespace,
     * which only a root workbench keeps; elsewhere the host refuses such a
     * call before it gets here, and the kernel would too (EPERM). */
    if ((gid_t)gid != getgid() && syscall(SYS_setresgid, gid, gid, gid) < 0)
        die(ctl, ST_USER, errno, "setresgid", NULL);
    if ((uid_t)uid != getuid() && syscall(SYS_setresuid, uid, uid, uid) < 0)
        die(ctl, ST_USER, errno, "setresuid", NULL);
    if (write_all(ctl, "S", 1) < 0) _exit(127);
    /* Bounded: the init sleeps until this child execs or exits (CLONE_VFORK). */
    for (;;) {
        struct pollfd wait_go = {.fd = ctl, .events = POLLIN};
        int ready = poll(&wait_go, 1, SESSION_GO_TIMEOUT_MS);
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) _exit(127); /* no answer: the call is given up */
        break;
    }
    do got = read(ctl, &go, 1);
    while (got < 0 && errno == EINTR);
    if (got != 1 || go != 'G') _exit(127); /* the host gave up on the call */
}

__attribute__((noreturn)) static void session_exec_child(const struct spec *s, const int *fds, long uid, long gid,
                                                         const char *cwd, char **argv, char **envp,
                                                         const sigset_t *mask) {
    struct spec call = *s;
    int ctl = fds[3];
    for (int i = 0; i < 3; i++)
        if (fds[i] != i && dup2(fds[i], i) < 0) die(ctl, ST_PREPARING, errno, "dup2 of the call's stdio", NULL);
    /* Only the call's stdio and its control socket (close-on-exec: an exec
     * error is reported on it, success is its EOF in this process). */
    if (ctl > 3) (void)syscall(SYS_close_range, 3u, (unsigned int)ctl - 1, 0u);
    (void)syscall(SYS_close_range, (unsigned int)ctl + 1, ~0u, 0u);
    if (fcntl(ctl, F_SETFD, FD_CLOEXEC) < 0) die(ctl, ST_PREPARING, errno, "the control socket", NULL);
    session_enter(ctl, uid, gid);
    if (chdir(cwd) < 0) die(ctl, ST_CWD, errno, cwd, NULL);
    if (sigprocmask(SIG_SETMASK, mask, NULL) < 0) die(ctl, ST_PREPARING, errno, "signal mask", NULL);
    call.argv = argv;
    call.envp = envp;
    call.search_path = "/bin:/usr/bin";
    for (char **e = envp; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0) call.search_path = *e + 5;
    exec_command(ctl, &call);
}

/* Send the opened file on the control socket ("F" with SCM_RIGHTS), let go of
 * it and say so ("D"): the host returns once nothing in the cell holds the
 * file any more (no ETXTBSY for a program it just wrote, no fifo end left
 * open), without waiting for the init to reap this child. */
__attribute__((noreturn)) static void session_send_file(int ctl, int file) {
    struct msghdr msg;
    struct iovec iov;
    char byte = 'F';
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    struct cmsghdr *cmsg;
    memset(&msg, 0, sizeof msg);
    memset(&control, 0, sizeof control);
    iov.iov_base = &byte;
    iov.iov_len = 1;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof control.buf;
    cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cmsg), &file, sizeof(int));
    while (sendmsg(ctl, &msg, MSG_NOSIGNAL) < 0)
        if (errno != EINTR) die(ctl, ST_OPEN, errno, "sending the descriptor", NULL);
    (void)close(file); /* the message holds its own reference (unix(7) SCM_RIGHTS) */
    (void)write_all(ctl, "D", 1);
    _exit(0);
}

/* The open that may wait (a fifo's other end, a device), in a fork of its
 * own: the init must stay free. */
__attribute__((noreturn)) static void session_open_blocking(int ctl, const char *path, long flags, long mode) {
    int file = open(path, (int)flags | O_CLOEXEC | O_NOCTTY, (mode_t)(mode < 0 ? 0666 : mode));
    if (file < 0) die(ctl, ST_OPEN, errno, path, NULL);
    if (mode >= 0 && fchmod(file, (mode_t)mode) < 0) die(ctl, ST_OPEN, errno, path, NULL);
    session_send_file(ctl, file);
}

/* Whether an open of a file of this type may wait for something else: a
 * fifo's other end (unless O_NONBLOCK), a device's driver (always: a driver
 * may ignore O_NONBLOCK at open). A regular file, a directory, a socket
 * (ENXIO at once) or a symlink (O_NOFOLLOW: ELOOP at once) never does. */
static int session_may_wait(mode_t type, long flags) {
    if (S_ISCHR(type) || S_ISBLK(type)) return 1;
    return S_ISFIFO(type) && !(flags & O_NONBLOCK);
}

/* A file call's child: it shares the init's memory (CLONE_VM | CLONE_VFORK,
 * no copy of the launcher's page tables) and the init sleeps until it exits,
 * so it makes no call that can wait on anything in the cell. It first looks
 * the path up with O_PATH, which opens nothing (no driver, no fifo end, no
 * Landlock right: O_PATH skips security_file_open), and learns what the path
 * is; then a regular file or a directory, or a new file, is opened for real
 * here with O_NONBLOCK added, which cannot wait even if the path changed in
 * between (a lease: EWOULDBLOCK instead of lease-break-time; a fifo swapped
 * in: at once either way), and the result's type is checked again. What may
 * wait is opened by a fork of this child (the old cost, in proportion to
 * the launcher's memory): the init goes on serving, and the fork ends with
 * the cell if nothing answers. Permissions are the call's user's (ids set
 * by session_enter), inside the cell's view and Landlock domain. */
__attribute__((noreturn)) static void session_open_child(int ctl, long uid, long gid, const char *path, long flags,
                                                         long mode) {
    struct stat st;
    int probe, file, status_flags;
    memset(&st, 0, sizeof st);
    (void)syscall(SYS_close_range, 3u, (unsigned int)ctl - 1, 0u);
    (void)syscall(SYS_close_range, (unsigned int)ctl + 1, ~0u, 0u);
    session_enter(ctl, uid, gid);
    probe = open(path, O_PATH | O_CLOEXEC | (int)(flags & (O_NOFOLLOW | O_DIRECTORY)));
    if (probe >= 0) {
        if (fstat(probe, &st) < 0) die(ctl, ST_OPEN, errno, path, NULL);
        (void)close(probe);
        if (session_may_wait(st.st_mode, flags)) goto blocking;
    } else if (errno != ENOENT || !(flags & O_CREAT)) {
        /* The walk failed: the open would have, with the same error (and
         * the same audit record, a refused lookup being one). */
        die(ctl, ST_OPEN, errno, path, NULL);
    }
    /* The session's umask is 022, like a command's; an explicit mode is set
     * exactly (fchmod), as os.chmod after the write would. */
    file = open(path, (int)flags | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, (mode_t)(mode < 0 ? 0666 : mode));
    if (file < 0) {
        /* A lease (EWOULDBLOCK) or a fifo swapped in (ENXIO; a socket's
         * ENXIO is final): wait for it in a fork, as the call asked. */
        int err = errno;
        if (!(flags & O_NONBLOCK) &&
            (err == EWOULDBLOCK || err == EAGAIN || (err == ENXIO && !(probe >= 0 && S_ISSOCK(st.st_mode)))))
            goto blocking;
        die(ctl, ST_OPEN, err, path, NULL);
    }
    if (fstat(file, &st) < 0) die(ctl, ST_OPEN, errno, path, NULL);
    if (session_may_wait(st.st_mode, flags)) { /* swapped in since the lookup */
        (void)close(file);
        goto blocking;
    }
    if (mode >= 0 && fchmod(file, (mode_t)mode) < 0) die(ctl, ST_OPEN, errno, path, NULL);
    if (!(flags & O_NONBLOCK) && ((status_flags = fcntl(file, F_GETFL)) < 0 ||
                                  fcntl(file, F_SETFL, status_flags & ~O_NONBLOCK) < 0))
        die(ctl, ST_OPEN, errno, path, NULL);
    session_send_file(ctl, file);
blocking:
    /* A plain, raw fork (no atfork handler: this child shares the init's
     * glibc); it inherits the call's ids, process group and descriptors. */
    switch ((pid_t)syscall(SYS_clone, (unsigned long)SIGCHLD, 0UL, 0UL, 0UL, 0UL)) {
    case -1:
        die(ctl, ST_OPEN, errno, "fork of the opener", NULL);
    case 0:
        session_open_blocking(ctl, path, flags, mode);
    default:
        _exit(0); /* the fork holds ctl: the host reads on until it lets go */
    }
}

static void session_refuse(int ctl, int err, const char *what) {
    struct line l = {.len = 0};
    put_char(&l, 'E');
    put(&l, ST_SESSION);
    put_char(&l, '\t');
    put_int(&l, err);
    put_char(&l, '\t');
    put(&l, what);
    put_char(&l, '\n');
    (void)write_all(ctl, l.buf, l.len);
}

/* What a call's child needs, on the init's stack: it shares the init's memory
 * and the init sleeps until it execs or exits, so pointers into the request
 * stay good. */
struct session_child {
    const struct spec *spec;
    const int *fds;
    const char *cwd;
    char **strings;
    const sigset_t *mask;
    long uid, gid, argc, flags, mode;
    char kind;
};

static int session_child_main(void *arg) {
    const struct session_child *c = arg;
    if (c->kind == 'O') session_open_child(c->fds[0], c->uid, c->gid, c->cwd, c->flags, c->mode);
    session_exec_child(c->spec, c->fds, c->uid, c->gid, c->cwd, c->strings, c->strings + c->argc + 1, c->mask);
}

/* One request: parse it, start its child. The descriptors are the init's to close. */
static void session_request(const struct spec *s, char *buf, size_t len, const int *fds, int n_fds,
                            struct session_call *calls, char **strings, const sigset_t *mask, char *stack_top) {
    const char *at = buf, *end = buf + len, *kind, *cwd;
    long uid, gid, argc = 0, flags = 0, mode = -1;
    struct session_child child;
    size_t n = 0;
    int ctl = n_fds > 0 ? fds[n_fds - 1] : -1;
    pid_t pid;
    size_t slot;
    if (ctl < 0) return;
    kind = session_field(&at, end);
    if (kind == NULL || (kind[0] != 'X' && kind[0] != 'O') || kind[1] != '\0' ||
        n_fds != (kind[0] == 'X' ? 4 : 1) || session_number(session_field(&at, end), 0, UINT32_MAX - 1, &uid) < 0 ||
        session_number(session_field(&at, end), 0, UINT32_MAX - 1, &gid) < 0 ||
        (cwd = session_field(&at, end)) == NULL || cwd[0] != '/') {
        session_refuse(ctl, EINVAL, "a malformed request");
        return;
    }
    if (kind[0] == 'O') {
        if (session_number(session_field(&at, end), 0, INT_MAX, &flags) < 0 ||
            session_number(session_field(&at, end), -1, 07777, &mode) < 0 || at != end) {
            session_refuse(ctl, EINVAL, "a malformed open request");
            return;
        }
    } else {
        if (session_number(session_field(&at, end), 1, SESSION_MAX_STRINGS, &argc) < 0) {
            session_refuse(ctl, EINVAL, "a malformed argc");
            return;
        }
        for (; at < end; n++) {
            const char *field = session_field(&at, end);
            if (field == NULL || n + 2 >= SESSION_MAX_STRINGS) {
                session_refuse(ctl, EINVAL, "a malformed argv or env");
                return;
            }
            strings[n + ((long)n >= argc ? 1 : 0)] = (char *)field;
        }
        if ((long)n < argc) {
            session_refuse(ctl, EINVAL, "fewer arguments than argc");
            return;
        }
        strings[argc] = NULL;     /* argv's end; env follows it */
        strings[n + 1] = NULL;    /* env's end */
    }
    for (slot = 0; slot < SESSION_MAX_CALLS && calls[slot].pid > 0; slot++) {
    }
    if (slot == SESSION_MAX_CALLS) {
        session_refuse(ctl, EAGAIN, "too many calls in flight");
        return;
    }
    /* Not a fork, which would copy the page tables of all the launcher's
     * memory the init holds (the header comment): the child shares it until
     * its execve or _exit, on a stack of its own, as cell_command does.
     * glibc's clone() runs no atfork handler. */
    child = (struct session_child){.spec = s, .fds = fds, .cwd = cwd, .strings = strings, .mask = mask,
                                   .uid = uid, .gid = gid, .argc = argc, .flags = flags, .mode = mode,
                                   .kind = kind[0]};
    /* An open child forks an opener of its own for what may wait (a fifo,
     * a device: session_open_child), so neither kind can keep the init asleep. */
    pid = clone(session_child_main, stack_top, CLONE_VM | CLONE_VFORK | SIGCHLD, &child);
    if (pid < 0) {
        session_refuse(ctl, errno, "fork of the call");
        return;
    }
    calls[slot].pid = pid;
    calls[slot].ctl = fcntl(ctl, F_DUPFD_CLOEXEC, 3);
    if (calls[slot].ctl < 0) { /* it can report no status, but its child runs: it is reaped all the same */
        calls[slot].pid = 0;
    }
}

static void session_reap(struct session_call *calls) {
    int status;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (size_t i = 0; i < SESSION_MAX_CALLS; i++) {
            struct line l = {.len = 0};
            if (calls[i].pid != pid) continue;
            put_char(&l, 'W');
            put_int(&l, status);
            put_char(&l, '\n');
            (void)write_all(calls[i].ctl, l.buf, l.len);
            (void)close(calls[i].ctl);
            calls[i].pid = 0;
            calls[i].ctl = -1;
            break;
        }
        /* Anything else is an orphan the pid namespace handed to pid 1. */
    }
}

/* ------------------------------------------------ the launcher's memory, let go
 *
 * The init is a clone of the launcher that never execs: it holds a
 * copy-on-write image of all the launcher's memory (an eval's interpreter:
 * 90-300 MiB) for as long as the session lives. Each page of it costs the
 * launcher a copy the first time it writes there (its heap, while the session
 * runs), and the page tables of all of it are torn down when the cell ends,
 * after the cell's last process, before the host learns that it ended: 4 ms
 * at 86 MiB, 8 ms at 278 MiB (docs/PERFORMANCE.md). The session loop needs
 * none of it: it runs on its own stack, in its own mmaps, on the code and
 * data of the loaded objects. So before it serves, the init unmaps the
 * launcher's private, writable, anonymous mappings (the interpreter's arenas,
 * its other threads' stacks, large buffers), keeping:
 *  - every loaded object's segments, bss included (each ELF's PT_LOAD
 *    ranges, read from its headers where it is mapped: a bss or an object's
 *    data may be anonymous),
 *  - [heap] and every other named mapping (brk heap: ld.so's own state),
 *  - whatever holds the init's stack, C1's (which waits in wait4 on it, in
 *    this same memory: CLONE_VM), the thread pointer (TLS: errno, the stack
 *    protector's canary) and the spec,
 *  - everything not both readable and writable (guard pages, code).
 * Anything it cannot read or parse (no /proc, too many mappings) leaves the
 * memory as it is: slower, never wrong. */
#include <elf.h>

#define SESSION_MAPS_MAX (4u << 20) /* /proc/self/maps of 40k mappings; more: nothing is dropped */
#define SESSION_KEEPS_MAX 16384     /* PT_LOAD ranges of the loaded objects */

struct session_range {
    uintptr_t lo, hi;
};

static const char *session_hex(const char *at, const char *end, uintptr_t *out) {
    uintptr_t value = 0;
    int any = 0;
    for (; at < end; at++, any = 1) {
        char c = *at;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) break;
        value = value * 16 + (uintptr_t)d;
    }
    *out = value;
    return any ? at : NULL;
}

/* One line of /proc/self/maps: its range, perms, offset, and whether it is
 * anonymous (inode 0, no name). */
struct session_map {
    uintptr_t lo, hi, offset;
    char perms[4];
    int anonymous, file;
};

static const char *session_map_line(const char *at, const char *end, struct session_map *m) {
    const char *eol = memchr(at, '\n', (size_t)(end - at)), *p;
    uintptr_t ignored;
    if (eol == NULL) return NULL;
    if ((p = session_hex(at, eol, &m->lo)) == NULL || *p != '-') return NULL;
    if ((p = session_hex(p + 1, eol, &m->hi)) == NULL || *p != ' ' || eol - p < 6) return NULL;
    memcpy(m->perms, p + 1, 4);
    p += 6;
    if ((p = session_hex(p, eol, &m->offset)) == NULL || *p != ' ') return NULL;
    /* dev "fd:01" */
    if ((p = session_hex(p + 1, eol, &ignored)) == NULL || *p != ':') return NULL;
    if ((p = session_hex(p + 1, eol, &ignored)) == NULL || *p != ' ') return NULL;
    p++;
    m->file = 0;
    for (; p < eol && *p >= '0' && *p <= '9'; p++)
        if (*p != '0') m->file = 1;
    while (p < eol && *p == ' ') p++;
    m->anonymous = !m->file && p == eol;
    return eol + 1;
}

/* len bytes at addr, through a pipe: a page that cannot be read (a mapped
 * file cut short: SIGBUS on a plain read) is EFAULT there instead. */
static int session_peek(const int *pipe_fds, uintptr_t addr, void *out, size_t len) {
    return write(pipe_fds[1], (const void *)addr, len) == (ssize_t)len &&
                   read(pipe_fds[0], out, len) == (ssize_t)len
               ? 0
               : -1;
}

#define SESSION_PHDRS_MAX 128

/* The PT_LOAD ranges of an ELF object mapped from offset 0 at m, added to
 * keep; cap + 1 when they cannot all be told (the caller drops nothing). */
static size_t session_segments(const struct session_map *m, const int *pipe_fds, struct session_range *keep,
                               size_t n, size_t cap) {
    Elf64_Ehdr eh;
    Elf64_Phdr ph[SESSION_PHDRS_MAX];
    uintptr_t page = (uintptr_t)getpagesize(), bias = 0;
    int first = 1;
    if (m->offset != 0 || m->perms[0] != 'r' || m->hi - m->lo < sizeof eh) return n;
    if (session_peek(pipe_fds, m->lo, &eh, sizeof eh) < 0) return n;
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return n; /* a data file, not an object */
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_phentsize != sizeof ph[0] || eh.e_phnum > SESSION_PHDRS_MAX ||
        session_peek(pipe_fds, m->lo + eh.e_phoff, ph, eh.e_phnum * sizeof ph[0]) < 0)
        return cap + 1;
    for (size_t i = 0; i < eh.e_phnum; i++) {
        if (ph[i].p_type != PT_LOAD) continue;
        if (first) {
            bias = m->lo - (ph[i].p_vaddr & ~(page - 1));
            first = 0;
        }
        if (n == cap) return cap + 1;
        keep[n].lo = bias + (ph[i].p_vaddr & ~(page - 1));
        keep[n].hi = bias + ((ph[i].p_vaddr + ph[i].p_memsz + page - 1) & ~(page - 1));
        n++;
    }
    return n;
}

/* What to unmap of the launcher's memory (the comment above), as ranges at
 * *drops (in an mmap of its own that session_drop_step unmaps after the
 * last); their number, 0 (and nothing mapped) when it cannot be told for
 * sure. */
static size_t session_plan_drops(const void *const *held, size_t n_held, struct session_range **drops) {
    char *maps = mmap(NULL, SESSION_MAPS_MAX, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    struct session_range *keep = mmap(NULL, 2 * SESSION_KEEPS_MAX * sizeof *keep, PROT_READ | PROT_WRITE,
                                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    size_t len = 0, n_keep = 0, n_drops = 0, planned = 0;
    const char *at = NULL, *end;
    struct session_map m;
    int fd = -1, pipe_fds[2] = {-1, -1};
    *drops = keep == MAP_FAILED ? NULL : keep + SESSION_KEEPS_MAX;
    if (maps == MAP_FAILED || keep == MAP_FAILED) goto out;
    fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || pipe2(pipe_fds, O_CLOEXEC) < 0) goto out;
    for (;;) {
        ssize_t got = read(fd, maps + len, SESSION_MAPS_MAX - len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) goto out;
        if (got == 0) break;
        len += (size_t)got;
        if (len == SESSION_MAPS_MAX) goto out; /* cut short: drop nothing */
    }
    end = maps + len;
    for (at = maps; at < end && (at = session_map_line(at, end, &m)) != NULL;)
        if (m.file && (n_keep = session_segments(&m, pipe_fds, keep, n_keep, SESSION_KEEPS_MAX)) > SESSION_KEEPS_MAX)
            goto out;
    if (at == NULL) goto out; /* a line this parser does not know: drop nothing */
    for (at = maps; at < end && n_drops < SESSION_KEEPS_MAX && (at = session_map_line(at, end, &m)) != NULL;) {
        int needed = ((uintptr_t)maps >= m.lo && (uintptr_t)maps < m.hi) ||
                     ((uintptr_t)keep >= m.lo && (uintptr_t)keep < m.hi);
        if (!m.anonymous || m.perms[0] != 'r' || m.perms[1] != 'w' || m.perms[3] != 'p') continue;
        for (size_t i = 0; i < n_held && !needed; i++)
            needed = (uintptr_t)held[i] >= m.lo && (uintptr_t)held[i] < m.hi;
        for (size_t i = 0; i < n_keep && !needed; i++) needed = keep[i].lo < m.hi && m.lo < keep[i].hi;
        if (!needed) (*drops)[n_drops++] = (struct session_range){m.lo, m.hi};
    }
    planned = n_drops;
out:
    if (fd >= 0) (void)close(fd);
    for (int i = 0; i < 2; i++)
        if (pipe_fds[i] >= 0) (void)close(pipe_fds[i]);
    if (maps != MAP_FAILED) (void)munmap(maps, SESSION_MAPS_MAX);
    if (planned == 0 && keep != MAP_FAILED) (void)munmap(keep, 2 * SESSION_KEEPS_MAX * sizeof *keep);
    return planned;
}

/* Unmap the next part of what session_plan_drops found: at most
 * SESSION_DROP_STEP at a time, between requests, so that a call waits for
 * one step at most (the whole of 270 MiB takes about 12 ms). */
#define SESSION_DROP_STEP (4u << 20)
static void session_drop_step(struct session_range *drops, size_t *next, size_t n_drops) {
    struct session_range *r = &drops[*next];
    size_t step = r->hi - r->lo < SESSION_DROP_STEP ? r->hi - r->lo : SESSION_DROP_STEP;
    (void)munmap((void *)r->lo, step);
    r->lo += step;
    if (r->lo == r->hi) (*next)++;
    if (*next == n_drops) (void)munmap(drops - SESSION_KEEPS_MAX, 2 * SESSION_KEEPS_MAX * sizeof *drops);
}

/* The init's life in session mode; it never returns. The signals are
 * blocked (cell_init) and taken from a signalfd: SIGCHLD reaps, anything else
 * (run.stop's SIGTERM) is passed on to every call's process group. */
__attribute__((noreturn)) static void session_loop(const struct spec *s, int sock, const sigset_t *all,
                                                   const sigset_t *mask) {
    struct spec own = *s; /* its argv, env and search path are each call's own */
    sigset_t own_mask = *mask;
    const void *held[] = {__builtin_frame_address(0), &own, s, mask, &errno};
    size_t strings_size = SESSION_MAX_STRINGS * sizeof(char *);
    char *buf, **strings, *stack;
    struct session_call *calls;
    int sig;
    struct session_range *drops;
    size_t n_drops, next_drop = 0;
    /* First: what is mapped from here on is the loop's own. Unmapped a step
     * at a time when no request waits (session_drop_step). */
    n_drops = session_plan_drops(held, sizeof held / sizeof *held, &drops);
    s = &own;
    mask = &own_mask;
    buf = mmap(NULL, SESSION_MAX_REQUEST + 1 + strings_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
               -1, 0);
    calls = mmap(NULL, SESSION_MAX_CALLS * sizeof *calls, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    /* The calls' children's stack, one at a time (CLONE_VFORK), with a guard page. */
    stack = mmap(NULL, INIT_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    sig = signalfd(-1, all, SFD_CLOEXEC);
    if (buf == MAP_FAILED || calls == MAP_FAILED || stack == MAP_FAILED || sig < 0) _exit(127);
    if (mprotect(stack, (size_t)getpagesize(), PROT_NONE) < 0) _exit(127);
    strings = (char **)(void *)(buf + SESSION_MAX_REQUEST + 1 + (8 - (SESSION_MAX_REQUEST + 1) % 8) % 8);
    strings_size = 0;
    for (size_t i = 0; i < SESSION_MAX_CALLS; i++) calls[i].ctl = -1;
    for (;;) {
        struct pollfd ready[2] = {{.fd = sock, .events = POLLIN}, {.fd = sig, .events = POLLIN}};
        int ready_count = poll(ready, 2, next_drop < n_drops ? 0 : -1);
        if (ready_count < 0) continue; /* EINTR */
        if (ready_count == 0) {
            session_drop_step(drops, &next_drop, n_drops);
            continue;
        }
        if (ready[1].revents & POLLIN) {
            struct signalfd_siginfo info;
            if (read(sig, &info, sizeof info) == (ssize_t)sizeof info) {
                if (info.ssi_signo == SIGCHLD)
                    session_reap(calls);
                else if (info.ssi_signo != SIGPIPE) /* the init's own: its 'W' to a call whose host end
                                                     * had closed (every file call); not for the calls */
                    for (size_t i = 0; i < SESSION_MAX_CALLS; i++)
                        if (calls[i].pid > 0) (void)kill(-calls[i].pid, (int)info.ssi_signo);
            }
        }
        if (ready[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            struct msghdr msg;
            struct iovec iov;
            union {
                char buf[CMSG_SPACE(4 * sizeof(int))];
                struct cmsghdr align;
            } control;
            int fds[4], n_fds = 0;
            ssize_t got;
            memset(&msg, 0, sizeof msg);
            iov.iov_base = buf;
            iov.iov_len = SESSION_MAX_REQUEST;
            msg.msg_iov = &iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.buf;
            msg.msg_controllen = sizeof control.buf;
            got = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) _exit(0); /* the host closed the session: the cell ends */
            for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
                size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < count; i++) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                    if (n_fds < 4)
                        fds[n_fds++] = fd;
                    else
                        (void)close(fd);
                }
            }
            if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
                if (n_fds > 0) session_refuse(fds[n_fds - 1], E2BIG, "a request too large");
            } else {
                buf[got] = '\0';
                session_request(s, buf, (size_t)got, fds, n_fds, calls, strings, mask, stack + INIT_STACK);
            }
            for (int i = 0; i < n_fds; i++) (void)close(fds[i]);
        }
    }
}
