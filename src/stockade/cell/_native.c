/*
 * stockade.cell._native: the launcher's children, in C.
 *
 * _launch.launch() forks a warm Python process: C1 enters the cell's
 * namespaces, C2 (the cell's pid 1, its init) builds the filesystem view, drops
 * every privilege, applies Landlock and seccomp, and forks C3, which execs the
 * command; C2 then stays as a small init (init_loop: reaps, passes signals on,
 * exits with the command's status). When those
 * children ran Python, most of a launch was the interpreter around a few dozen
 * syscalls. spawn() below takes everything the children need, converts it to
 * plain C data while it may still use the Python API, forks, and from then on
 * only makes syscalls: no Python, no malloc, no stdio, nothing that takes a
 * lock (the parent may run threads, whose locks a forked child inherits held).
 * Every message is formatted by hand into a buffer on the stack.
 *
 * The protocol with _launch._parent_side() on the status pipe:
 *   "U\n"                        C1 is in its new namespaces (the parent maps its
 *                                ids and writes "G" on the go pipe)
 *   "P<pid>\n"                   C2, the cell's pid 1, started (its host pid)
 *   "E<stage>\t<errno>\t<msg>\n"  a step failed; the child exits 127 right after
 *   end of file                  the command was exec'd (the pipe is close-on-exec)
 * C1 waits for C2 and exits with its status; C2 exits with the command's
 * (128+N when a signal N killed it, as shells report).
 *
 * Beyond the Python launcher it replaces: C1 closes every descriptor it does
 * not need (it never execs, so O_CLOEXEC never did), C2 shares C1's memory
 * until its exec (CLONE_VM | CLONE_VFORK), and signals are blocked across the
 * first fork so that no handler of the parent runs in the child.
 *
 * Syscall numbers come from <sys/syscall.h>; those of the new mount API and
 * Landlock are the same on every architecture (the unified table, 424 on).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <sys/ioctl.h>
#include <link.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/securebits.h>
#include <linux/seccomp.h>

/* Unified syscall numbers (include/uapi/asm-generic/unistd.h), for C libraries
 * older than the calls. */
#ifndef SYS_open_tree
#define SYS_open_tree 428 /* Linux 5.2 */
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429 /* Linux 5.2 */
#endif
#ifndef SYS_close_range
#define SYS_close_range 436 /* Linux 5.9 */
#endif
#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442 /* Linux 5.12 */
#endif
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444 /* Linux 5.13 */
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

/* <linux/mount.h>, open_tree(2), move_mount(2), mount_setattr(2). Our own
 * names, because glibc's <sys/mount.h> and <linux/mount.h> clash on some
 * versions and define these only on others. */
#define CELL_OPEN_TREE_CLONE 1u
#define CELL_MOVE_MOUNT_F_EMPTY_PATH 0x4u
#define CELL_AT_RECURSIVE 0x8000u /* <linux/fcntl.h>: apply to the whole subtree */
#define CELL_MOUNT_ATTR_RDONLY 0x1u
#define CELL_MOUNT_ATTR_NOSUID 0x2u
#define CELL_MOUNT_ATTR_NODEV 0x4u
#define CELL_MOUNT_ATTR_NOEXEC 0x8u
#define CELL_MOUNT_ATTR_IDMAP 0x100000u /* Linux 5.12 */
struct cell_mount_attr { /* struct mount_attr, MOUNT_ATTR_SIZE_VER0 = 32 */
    uint64_t attr_set, attr_clr, propagation, userns_fd;
};

/* <linux/landlock.h>: the net port rule (ABI 4) is newer than Debian 12's headers. */
#define CELL_LANDLOCK_RULE_PATH_BENEATH 1
#define CELL_LANDLOCK_RULE_NET_PORT 2
struct cell_path_beneath { /* struct landlock_path_beneath_attr, packed: 12 bytes */
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));
/* LANDLOCK_ACCESS_FS_EXECUTE, _WRITE_FILE, _READ_FILE, _TRUNCATE (ABI 3) and
 * _IOCTL_DEV (ABI 5): the rights a rule on a file may hold. */
#define LL_FILE_RIGHTS ((1ull << 0) | (1ull << 1) | (1ull << 2) | (1ull << 14) | (1ull << 15))
/* The init keeps the descriptors of its Landlock paths below this number
 * (or half its RLIMIT_NOFILE) open until close_except. */
#define LL_OPEN_MAX 512
struct cell_net_port { /* struct landlock_net_port_attr: 16 bytes */
    uint64_t allowed_access;
    uint64_t port;
};

/* The cell's seven namespaces (clone(2)): everything bwrap --unshare-all makes. */
#define CELL_NAMESPACES (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | \
                         CLONE_NEWUTS | CLONE_NEWCGROUP)
#define CELL_UID 1000 /* _plan.CELL_UID: the agent inside the cell */

/* <linux/securebits.h>: root gets no capabilities from exec, setuid does not
 * fix them up, ambient raising is off, and each of these is locked. */
#define CELL_SECUREBITS                                                                       \
    (SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED | \
     SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED)

/* Where C2 mounts its staging tmpfs before the first pivot: the host's /tmp
 * only inside C2's own mount namespace, and the host's /tmp stays reachable as
 * /oldroot/tmp (the trick bubblewrap uses). */
#define STAGE_DIR "/tmp"
#define REPORT_MAX 4096           /* PIPE_BUF: a report is one atomic write */
#define PATH_ROOM (PATH_MAX - 64) /* longest path accepted: room for "/newroot" and the like */
#define INIT_STACK (256 * 1024)   /* C2's stack: a few PATH_MAX buffers deep at most */

/* Stage names: what _launch reports and what users read ("cell setup failed while ..."). */
static const char ST_PREPARING[] = "preparing";
static const char ST_AUDIT[] = "setting the audit session";
static const char ST_CGROUPS[] = "joining cgroups";
static const char ST_GRANTS[] = "preparing the grants";
static const char ST_UNSHARE[] = "unshare";
static const char ST_VIEW[] = "building the filesystem view";
static const char ST_HOSTNAME[] = "naming the host";
static const char ST_LOOPBACK[] = "bringing up loopback";
static const char ST_WORKDIR[] = "entering the workdir";
static const char ST_PRIVS[] = "dropping privileges";
static const char ST_LANDLOCK[] = "applying landlock";
static const char ST_SECCOMP[] = "loading seccomp";
static const char ST_EXEC[] = "exec";

/* ------------------------------------------------------------------ the spec */

enum kind {
    K_BIND, K_TMPFS, K_DIR, K_SYMLINK, K_FILE, K_DECOY_FILE, K_DECOY_DIR, K_PROC, K_DEV, K_SYSFS, K_OVERLAY,
    K_COUNT
};
static const char *const KIND_NAMES[K_COUNT] = {
    "bind", "tmpfs", "dir", "symlink", "file", "decoy_file", "decoy_dir", "proc", "dev", "sysfs", "overlay"};

struct op { /* one _plan.MountOp */
    int kind, writable, from_view, userns_fd;
    const char *dst, *src;
    const char *data;
    size_t data_len;
    const char **names; /* decoy_dir: entry names; dev: device names */
    unsigned char *name_is_dir;
    size_t n_names;
    int tree_fd, tree_is_dir; /* set by C1: the detached copy of a host bind */
    int upper_fd;             /* overlay: set by C1, the detached copy of the upper's directory */
    int tmpl_fd;              /* decoy_dir: its template (decoy_template), shown as C1's copy; -1: made here */
};

struct spec {
    char **argv, **envp;
    const char *search_path, *workdir;
    struct op *ops;
    size_t n_ops;
    int landlock;
    uint64_t ll_attr[3];
    size_t ll_attr_len;
    struct cell_path_beneath *ll_ready;
    size_t n_ll_ready;
    const char **ll_paths;
    uint64_t *ll_dir_rights, *ll_file_rights;
    int *ll_held;                /* per path: a descriptor the parent keeps (hold_entries), or -1; or NULL */
    unsigned char *ll_held_dir;  /* whether that one is a directory */
    size_t n_ll_paths;
    struct cell_net_port *ll_ports;
    size_t n_ll_ports;
    unsigned int ll_flags;
    struct sock_fprog *filters;
    unsigned int *filter_flags;
    size_t n_filters;
    struct sock_fprog notify; /* the user-notification filter (filter.len 0: none) */
    int notify_sock;          /* where its listener is sent (SCM_RIGHTS), or -1 */
    const char **cgroups;
    size_t n_cgroups;
    char loginuid[24];
    int stdio[3], status_r, status_w, go_r, go_w, cap_last;
    int *keep, *c1_keep; /* sorted: what C2 hands to the command; what C1 keeps */
    long owner_uid, owner_gid; /* the host ids that create the cell's user namespace; -1: as called */
    int session_fd; /* session mode (_session_init.h): the init serves calls on it; -1: one command */
    long cell_uid, cell_gid; /* the command's ids inside (_plan.CellPlan.uid): CELL_UID unless a workbench's */
    uint64_t keep_caps;      /* capabilities kept inside the namespace (a workbench's root), else 0 */
    long decoy_uid, decoy_gid; /* the host ids of the cell's uid, who owns its decoys; -1: no template */
    const char **writable;     /* paths Landlock lets the cell write beneath: no template decoy there */
    size_t n_writable;
    size_t n_keep, n_c1_keep;
    pid_t parent;
    PyObject *owned; /* Python objects the parsing holds, alive until spec_free */
    /* Everything the pointers above point into: mmap'd chunks of the spec's
     * own (spec_alloc), never the Python heap, which lean_begin leaves out of
     * the children's copy of the parent's memory. */
    void **allocs;
    size_t *alloc_sizes;
    size_t n_allocs, cap_allocs;
    char *arena_at, *arena_end;
};

/* ---------------------------------------------- child side: reporting, helpers */

struct line {
    char buf[REPORT_MAX];
    size_t len;
};

static void put_char(struct line *l, char ch) {
    if (l->len < sizeof l->buf - 1) /* the last byte is kept for the newline */
        l->buf[l->len++] = ch;
}

static void put(struct line *l, const char *s) {
    /* Tabs and newlines delimit the report: none may appear inside a field. */
    for (; s != NULL && *s; s++) put_char(l, (*s == '\n' || *s == '\t') ? ' ' : *s);
}

static const char *digits_of(char *buf, unsigned long value);

static void put_int(struct line *l, long value) {
    char digits[24];
    if (value < 0) put_char(l, '-');
    put(l, digits_of(digits, value < 0 ? 0ul - (unsigned long)value : (unsigned long)value));
}

/* The decimal digits of value in buf (at least 24 bytes). */
static const char *digits_of(char *buf, unsigned long value) {
    char tmp[24];
    size_t n = 0, i = 0;
    do tmp[n++] = (char)('0' + value % 10);
    while ((value /= 10) && n < sizeof tmp);
    while (n) buf[i++] = tmp[--n];
    buf[i] = '\0';
    return buf;
}

static void put_strerror(struct line *l, int err) {
    /* strerrordesc_np (glibc 2.32) returns a constant string without touching
     * the locale or allocating, unlike strerror(3); os.strerror's text. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 32)
    const char *text = strerrordesc_np(err);
#else
    const char *text = NULL;
#endif
    if (text != NULL) {
        put(l, text);
    } else {
        put(l, "Unknown error ");
        put_int(l, err);
    }
}

static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Report "E<stage>\t<err>\t<parts...>: <strerror>\n" and exit 127: no step is
 * ever skipped or retried after a failure. The parts end with NULL. */
__attribute__((noreturn, sentinel)) static void die(int status_fd, const char *stage, int err, ...) {
    struct line l;
    va_list ap;
    const char *part;
    l.len = 0;
    put_char(&l, 'E');
    put(&l, stage);
    put_char(&l, '\t');
    put_int(&l, err);
    put_char(&l, '\t');
    va_start(ap, err);
    while ((part = va_arg(ap, const char *)) != NULL) put(&l, part);
    va_end(ap);
    put(&l, ": ");
    put_strerror(&l, err);
    l.buf[l.len++] = '\n';
    (void)write_all(status_fd, l.buf, l.len);
    _exit(127);
}

static void must_close(int status_fd, int fd, const char *stage, const char *what) {
    if (close(fd) < 0) die(status_fd, stage, errno, "close ", what, NULL);
}

/* out = a + b + c, or -1 with ENAMETOOLONG: every copy is bounded by cap. */
static int join(char *out, size_t cap, const char *a, const char *b, const char *c) {
    const char *parts[3] = {a, b, c};
    size_t len = 0;
    for (int i = 0; i < 3; i++) {
        size_t n = parts[i] ? strlen(parts[i]) : 0;
        if (n >= cap - len) {
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(out + len, parts[i] ? parts[i] : "", n);
        len += n;
    }
    out[len] = '\0';
    return 0;
}

#define JOIN(fd, stage, out, a, b, c)                                            \
    do {                                                                         \
        if (join(out, sizeof out, a, b, c) < 0) die(fd, stage, errno, a, b, c, NULL); \
    } while (0)

static void do_mount(int fd, const char *src, const char *dst, const char *type, unsigned long flags,
                     const char *data) {
    if (mount(src, dst, type, flags, data) < 0)
        die(fd, ST_VIEW, errno, "mount ", src ? src : (type ? type : "none"), " on ", dst, NULL);
}

static void set_attr(int fd, const char *path, uint64_t attrs, int recursive) {
    struct cell_mount_attr attr = {.attr_set = attrs};
    unsigned int flags = recursive ? CELL_AT_RECURSIVE : 0u;
    if (syscall(SYS_mount_setattr, AT_FDCWD, path, flags, &attr, sizeof attr) < 0)
        die(fd, ST_VIEW, errno, "mount_setattr ", path, NULL);
}

/* mkdir -p with mode 0755: up from the path until a directory exists, then down. */
static void makedirs(int fd, const char *path) {
    char buf[PATH_MAX];
    char *end, *cut;
    JOIN(fd, ST_VIEW, buf, path, NULL, NULL);
    end = cut = buf + strlen(buf);
    while (mkdir(buf, 0755) < 0 && errno != EEXIST) {
        char *slash = errno == ENOENT ? memrchr(buf, '/', (size_t)(cut - buf)) : NULL;
        if (slash == NULL || slash == buf) die(fd, ST_VIEW, errno, "mkdir ", buf, NULL);
        *slash = '\0';
        cut = slash;
    }
    while (cut != end) {
        *cut = '/';
        if (mkdir(buf, 0755) < 0 && errno != EEXIST) die(fd, ST_VIEW, errno, "mkdir ", buf, NULL);
        cut += strlen(cut);
    }
}

static void makedirs_parent(int fd, const char *path) {
    char buf[PATH_MAX];
    char *slash;
    JOIN(fd, ST_VIEW, buf, path, NULL, NULL);
    slash = strrchr(buf, '/');
    if (slash == NULL || slash == buf) return;
    *slash = '\0';
    makedirs(fd, buf);
}

/* An empty file to mount on. What exists already (followed as open would
 * follow it) is left as it is: opening it for writing changed nothing, and
 * where it refused (a host file under a read grant: /etc/shadow, /proc's
 * files) the refusal matched the mount layer's audit rule on EACCES, 16
 * kernel records a default cell's start made, read, attributed and dropped
 * by the audit reader (issue 18). A FIFO would block: hence O_NONBLOCK. */
static void touch(int fd, const char *path) {
    const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
    struct stat st;
    int file;
    if (stat(path, &st) == 0) return;
    file = open(path, flags, 0644);
    if (file < 0 && errno == ENOENT) {
        makedirs_parent(fd, path);
        file = open(path, flags, 0644);
        if (file < 0) die(fd, ST_VIEW, errno, "create ", path, NULL);
    }
    if (file >= 0) must_close(fd, file, ST_VIEW, path);
}

static int lexists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* --------------------------------------------------- child side: the view */

static void build_dev(int fd, const char *dst, const struct op *op) {
    char node[PATH_MAX], src[PATH_MAX];
    static const char *const links[][2] = {
        {"/fd", "/proc/self/fd"},     {"/stdin", "/proc/self/fd/0"}, {"/stdout", "/proc/self/fd/1"},
        {"/stderr", "/proc/self/fd/2"}, {"/core", "/proc/kcore"},      {"/ptmx", "pts/ptmx"},
    };
    makedirs(fd, dst);
    do_mount(fd, "tmpfs", dst, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755");
    for (size_t i = 0; i < op->n_names; i++) {
        JOIN(fd, ST_VIEW, node, dst, "/", op->names[i]);
        JOIN(fd, ST_VIEW, src, "/oldroot/dev/", op->names[i], NULL);
        touch(fd, node);
        do_mount(fd, src, node, NULL, MS_BIND, NULL);
    }
    JOIN(fd, ST_VIEW, node, dst, "/pts", NULL);
    if (mkdir(node, 0777) < 0) die(fd, ST_VIEW, errno, "mkdir ", node, NULL);
    do_mount(fd, "devpts", node, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
    JOIN(fd, ST_VIEW, node, dst, "/shm", NULL);
    if (mkdir(node, 0777) < 0) die(fd, ST_VIEW, errno, "mkdir ", node, NULL);
    do_mount(fd, "tmpfs", node, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
    for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
        JOIN(fd, ST_VIEW, node, dst, links[i][0], NULL);
        if (symlink(links[i][1], node) < 0) die(fd, ST_VIEW, errno, "symlink ", node, NULL);
    }
}

/* In a workbench's view (an image as its root), no mount point may lie
 * behind a symbolic link: the planner resolved the image's own links inside
 * the image (_workbench.resolve_in_image), so a link met here is one the
 * upper layer holds (a kept upper of an earlier run, which the agent wrote),
 * and following it from the staging root could lead anywhere, the host's
 * root (/oldroot) included. The agent does not run yet: nothing changes
 * between this check and the mount. */
static void refuse_links(int fd, const char *dst) {
    char path[PATH_MAX];
    struct stat st;
    size_t start = strlen("/newroot");
    JOIN(fd, ST_VIEW, path, dst, NULL, NULL);
    for (size_t i = start + 1;; i++) {
        char saved = path[i];
        if (saved != '/' && saved != '\0') continue;
        path[i] = '\0';
        if (lstat(path, &st) < 0) return; /* missing from here on: made fresh below */
        if (S_ISLNK(st.st_mode)) {
            errno = ELOOP;
            die(fd, ST_VIEW, errno, path + start, " is a symbolic link in the image's view; remove it from the upper layer", NULL);
        }
        path[i] = saved;
        if (saved == '\0') return;
    }
}

static void build_overlay(int fd, const char *dst, struct op *op) {
    /* The image's rootfs (lower, read-only) and the run's upper, both
     * idmapped by C1 (on disk the image's ids, here the cell's), mounted here,
     * inside the cell's user namespace: overlayfs then acts with the cell's
     * credentials, never host root's (overlayfs(5): "userxattr", its
     * xattrs in the user.overlay.* namespace, Linux 5.11). */
    char options[PATH_MAX];
    if (mkdir("/lower", 0700) < 0 || mkdir("/upper", 0700) < 0) die(fd, ST_VIEW, errno, "mkdir of the layers", NULL);
    if (syscall(SYS_move_mount, op->tree_fd, "", AT_FDCWD, "/lower", CELL_MOVE_MOUNT_F_EMPTY_PATH) < 0)
        die(fd, ST_VIEW, errno, "move_mount of the image ", op->src, NULL);
    if (syscall(SYS_move_mount, op->upper_fd, "", AT_FDCWD, "/upper", CELL_MOVE_MOUNT_F_EMPTY_PATH) < 0)
        die(fd, ST_VIEW, errno, "move_mount of the upper layer ", op->data, NULL);
    must_close(fd, op->tree_fd, ST_VIEW, op->src);
    must_close(fd, op->upper_fd, ST_VIEW, op->data);
    op->tree_fd = op->upper_fd = -1;
    if (op->n_names == 1) {
        /* No overlayfs here (stockade doctor: "copy"): the upper holds a
         * copy of the whole image, the run's own, shown as the root. */
        JOIN(fd, ST_VIEW, options, "/upper/", op->names[0], NULL);
        do_mount(fd, options, dst, NULL, MS_BIND, NULL);
        set_attr(fd, dst, CELL_MOUNT_ATTR_NOSUID | CELL_MOUNT_ATTR_NODEV, 0);
        return;
    }
    if (join(options, sizeof options, "lowerdir=/lower,upperdir=/upper/", op->names[0], ",workdir=/upper/") < 0 ||
        join(options + strlen(options), sizeof options - strlen(options), op->names[1], ",userxattr", NULL) < 0)
        die(fd, ST_VIEW, errno, "overlay options", NULL);
    do_mount(fd, "overlay", dst, "overlay", MS_NOSUID | MS_NODEV, options);
}

static void build_op(int fd, struct op *op, size_t index, int in_image) {
    char dst[PATH_MAX], path[PATH_MAX];
    int dir;
    JOIN(fd, ST_VIEW, dst, "/newroot", op->dst, NULL);
    if (in_image && op->kind != K_OVERLAY) refuse_links(fd, dst);
    switch (op->kind) {
    case K_OVERLAY:
        build_overlay(fd, dst, op);
        return;
    case K_BIND:
        if (!op->from_view) {
            if (op->tree_fd < 0) return; /* gone since planning: nothing to show */
            if (op->tree_is_dir)
                makedirs(fd, dst);
            else
                touch(fd, dst);
            if (syscall(SYS_move_mount, op->tree_fd, "", AT_FDCWD, dst, CELL_MOVE_MOUNT_F_EMPTY_PATH) < 0)
                die(fd, ST_VIEW, errno, "move_mount ", op->src, NULL);
            must_close(fd, op->tree_fd, ST_VIEW, op->src);
            op->tree_fd = -1;
            /* Grants are not read-only mounts even when read-only: such a mount
             * refuses a write before Landlock sees it, and so without a record;
             * Landlock refuses it instead and the kernel logs what was tried. */
        } else {
            /* A protected path inside a writable grant, as the cell sees it: no
             * Landlock rule can carve a name out of a writable tree, so a
             * read-only mount refuses it (EROFS); the directories leading to it
             * are mount points so that they cannot be renamed away (EBUSY). */
            JOIN(fd, ST_VIEW, path, "/newroot", op->src, NULL);
            if (!lexists(path)) return;
            do_mount(fd, path, dst, NULL, MS_BIND, NULL);
            set_attr(fd, dst, CELL_MOUNT_ATTR_NOSUID | CELL_MOUNT_ATTR_NODEV |
                                  (op->writable ? 0 : CELL_MOUNT_ATTR_RDONLY), 0);
        }
        return;
    case K_TMPFS: {
        /* data: more options (the /tmp of limits.disk: "size=...,nr_inodes=..."). */
        char options[256];
        if (op->data_len >= sizeof options - 16 || memchr(op->data, '\0', op->data_len) != NULL) {
            errno = EINVAL;
            die(fd, ST_VIEW, errno, "tmpfs options of ", op->dst, NULL);
        }
        memcpy(options, "mode=1777", 10);
        if (op->data_len) {
            options[9] = ',';
            memcpy(options + 10, op->data, op->data_len);
            options[10 + op->data_len] = '\0';
        }
        makedirs(fd, dst);
        do_mount(fd, "tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV, options);
        return;
    }
    case K_DECOY_FILE:
        touch(fd, dst);
        do_mount(fd, "/empty", dst, NULL, MS_BIND, NULL);
        set_attr(fd, dst, CELL_MOUNT_ATTR_NOSUID | CELL_MOUNT_ATTR_NODEV | CELL_MOUNT_ATTR_NOEXEC, 0);
        return;
    case K_DECOY_DIR:
        makedirs(fd, dst);
        if (op->tmpl_fd >= 0) {
            /* Its names were made once, in the decoy template (decoy_template):
             * C1's copy of its entry is mounted here, nothing is made. */
            if (syscall(SYS_move_mount, op->tree_fd, "", AT_FDCWD, dst, CELL_MOVE_MOUNT_F_EMPTY_PATH) < 0)
                die(fd, ST_VIEW, errno, "move_mount of the decoy ", op->dst, NULL);
            must_close(fd, op->tree_fd, ST_VIEW, op->dst);
            op->tree_fd = -1;
            return;
        }
        /* Inside a bind mount of the host: cover it with a tmpfs. A decoy in
         * the cell's own root needs no mount of its own. Either way it stays
         * writable by mode: Landlock, which grants nothing here, must be what
         * refuses an attempt, so that the kernel records it. */
        if (op->writable) do_mount(fd, "tmpfs", dst, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755");
        /* Names come parents first; one may exist already where hidden
         * places nest (/var/lib/stockade and its workspaces). Made relative
         * to the directory, and files by mknodat (one call, no open). */
        dir = open(dst, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0) die(fd, ST_VIEW, errno, "open ", dst, NULL);
        for (size_t i = 0; i < op->n_names; i++) {
            int made = op->name_is_dir[i] ? mkdirat(dir, op->names[i], 0755)
                                          : mknodat(dir, op->names[i], S_IFREG | 0644, 0);
            if (made < 0 && errno != EEXIST) die(fd, ST_VIEW, errno, "create ", dst, "/", op->names[i], NULL);
        }
        must_close(fd, dir, ST_VIEW, dst);
        return;
    case K_FILE: {
        /* Written in the staging root, then bound over the path: the host's
         * file under a read grant (/etc/passwd) is never written. */
        char staged[32], digits[24];
        int file;
        JOIN(fd, ST_VIEW, staged, "/file", digits_of(digits, index), NULL);
        file = open(staged, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (file < 0) die(fd, ST_VIEW, errno, "create ", staged, NULL);
        if (write_all(file, op->data, op->data_len) < 0)
            die(fd, ST_VIEW, errno ? errno : EIO, "write ", staged, NULL);
        must_close(fd, file, ST_VIEW, staged);
        touch(fd, dst);
        do_mount(fd, staged, dst, NULL, MS_BIND, NULL);
        return;
    }
    case K_SYMLINK:
        makedirs_parent(fd, dst);
        if (!lexists(dst) && symlink(op->src, dst) < 0) die(fd, ST_VIEW, errno, "symlink ", dst, NULL);
        return;
    case K_DIR:
        makedirs(fd, dst);
        return;
    case K_PROC: {
        static const char *const knobs[] = {"/sys", "/sysrq-trigger"};
        struct stat st;
        makedirs(fd, dst);
        do_mount(fd, "proc", dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
        /* The kernel knobs stay read-only (the rest of /proc that is not the
         * cell's own belongs to host root, which the cell is not). */
        for (size_t i = 0; i < 2; i++) {
            JOIN(fd, ST_VIEW, path, dst, knobs[i], NULL);
            if (stat(path, &st) < 0) continue;
            do_mount(fd, path, path, NULL, MS_BIND | MS_REC, NULL);
            set_attr(fd, path, CELL_MOUNT_ATTR_RDONLY | CELL_MOUNT_ATTR_NOSUID | CELL_MOUNT_ATTR_NODEV, 1);
        }
        return;
    }
    case K_SYSFS:
        /* A fresh sysfs, mounted from the cell's own network namespace (its
         * user namespace owns that one, so it may): the net class shows that
         * namespace's interfaces only (lo), never the host's, their MAC
         * addresses or traffic counters. The rest of sysfs is not namespaced;
         * what identifies the host is covered by decoys (_plan._SYS_HIDDEN). */
        makedirs(fd, dst);
        do_mount(fd, "sysfs", dst, "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
        return;
    case K_DEV:
        build_dev(fd, dst, op);
        return;
    }
}

static void build_view(int fd, struct spec *s) {
    /* Private propagation first, so nothing below reaches the host's mounts;
     * then the staging tmpfs becomes the root, the host's root stays reachable
     * as /oldroot, and the cell's root is assembled on another tmpfs at
     * /newroot, then pivoted into. */
    do_mount(fd, NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    do_mount(fd, "tmpfs", STAGE_DIR, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700");
    if (mkdir(STAGE_DIR "/newroot", 0777) < 0) die(fd, ST_VIEW, errno, "mkdir " STAGE_DIR "/newroot", NULL);
    if (mkdir(STAGE_DIR "/oldroot", 0777) < 0) die(fd, ST_VIEW, errno, "mkdir " STAGE_DIR "/oldroot", NULL);
    if (syscall(SYS_pivot_root, STAGE_DIR, STAGE_DIR "/oldroot") < 0)
        die(fd, ST_VIEW, errno, "pivot_root", NULL);
    if (chdir("/") < 0) die(fd, ST_VIEW, errno, "chdir /", NULL);
    do_mount(fd, "tmpfs", "/newroot", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
    touch(fd, "/empty");
    for (size_t i = 0; i < s->n_ops; i++) build_op(fd, &s->ops[i], i, s->n_ops && s->ops[0].kind == K_OVERLAY);
    if (chdir("/newroot") < 0) die(fd, ST_VIEW, errno, "chdir /newroot", NULL);
    /* pivot_root(".", "."): the old root ends up on top of the new one and is
     * detached at once (pivot_root(2), NOTES). */
    if (syscall(SYS_pivot_root, ".", ".") < 0) die(fd, ST_VIEW, errno, "pivot_root into the cell", NULL);
    if (umount2(".", MNT_DETACH) < 0) die(fd, ST_VIEW, errno, "detaching the host's root", NULL);
    if (chdir("/") < 0) die(fd, ST_VIEW, errno, "chdir /", NULL);
}

/* ------------------------------------------- child side: the rest of pid 1 */

static void loopback_up(int fd) {
    /* A new network namespace has only lo, and it is down (netdevice(7)). */
    struct ifreq ifr;
    int sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock < 0) die(fd, ST_LOOPBACK, errno, "loopback", NULL);
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    if (ioctl(sock, SIOCGIFFLAGS, &ifr) < 0) die(fd, ST_LOOPBACK, errno, "loopback", NULL);
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(sock, SIOCSIFFLAGS, &ifr) < 0) die(fd, ST_LOOPBACK, errno, "loopback", NULL);
    must_close(fd, sock, ST_LOOPBACK, "loopback socket");
}

/* keep: the capabilities a workbench's root keeps (_plan.ROOT_CAPS), inside
 * the cell's user namespace only; 0 for everyone else. Root then keeps them
 * across exec (no SECBIT_NOROOT: the bounding set is what it gets, and
 * no_new_privs caps it at what it had), and a setuid() away from root drops
 * them as it would anywhere. */
static void drop_privileges(int fd, int cap_last, uint64_t keep) {
    struct __user_cap_header_struct header = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    char number[24];
    unsigned long bits = keep ? (SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED) : CELL_SECUREBITS;
    memset(data, 0, sizeof data);
    data[0].permitted = data[0].effective = (uint32_t)keep;
    data[1].permitted = data[1].effective = (uint32_t)(keep >> 32);
    if (prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) < 0) die(fd, ST_PRIVS, errno, "securebits", NULL);
    for (int cap = 0; cap <= cap_last; cap++) {
        if (keep & (1ull << cap)) continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
            die(fd, ST_PRIVS, errno, "dropping capability ", digits_of(number, (unsigned long)cap), NULL);
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        die(fd, ST_PRIVS, errno, "ambient capabilities", NULL);
    /* capset(2) with version 3: two 32-bit words per set, all zero. */
    if (syscall(SYS_capset, &header, data) < 0) die(fd, ST_PRIVS, errno, "capset", NULL);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) die(fd, ST_PRIVS, errno, "no_new_privs", NULL);
}

static void apply_landlock(int fd, const struct spec *s) {
    /* As _landlock.apply: paths the parent opened come as ready rules; the
     * rest exist only in the cell (its /tmp, /dev, decoys) and are opened
     * here. Missing paths are skipped: nothing can reach them. */
    int ruleset;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        die(fd, ST_LANDLOCK, errno, "landlock: no_new_privs", NULL);
    ruleset = (int)syscall(SYS_landlock_create_ruleset, s->ll_attr, s->ll_attr_len, 0u);
    if (ruleset < 0) die(fd, ST_LANDLOCK, errno, "landlock: create_ruleset", NULL);
    for (size_t i = 0; i < s->n_ll_ready; i++)
        if (syscall(SYS_landlock_add_rule, ruleset, CELL_LANDLOCK_RULE_PATH_BENEATH, &s->ll_ready[i], 0u) < 0)
            die(fd, ST_LANDLOCK, errno, "landlock: add_rule for a granted path", NULL);
    /* Most of these paths are the entries of a few directories (those of
     * /etc and /sys that hold a hidden path: _plan._grants), in order: each
     * is opened from its directory's descriptor, kept while the next path
     * has the same directory, so that the lookup walks one name, not the
     * whole path (about 280 opens at a default cell's start, issue 18). The
     * same lookup as open(path): the directory followed as it would be, the
     * same search permission needed on it. Where the directory cannot be
     * opened, the path is opened whole, and fails as it would have. */
    char dir_path[PATH_MAX];
    int dir_fd = -1, open_max = LL_OPEN_MAX;
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur / 2 < (rlim_t)open_max)
        open_max = (int)(files.rlim_cur / 2);
    dir_path[0] = '\0';
    for (size_t i = 0; i < s->n_ll_paths; i++) {
        struct stat st;
        struct cell_path_beneath rule;
        int added = 0;
        const char *path = s->ll_paths[i], *slash = strrchr(path, '/');
        size_t dir_len = slash != NULL ? (size_t)(slash - path) : 0;
        int entry = slash != NULL && slash[1] != '\0' && dir_len < sizeof dir_path;
        int path_fd;
        if (s->ll_held != NULL && s->ll_held[i] >= 0) {
            /* The host's inode, opened by the parent (hold_entries). */
            rule.parent_fd = s->ll_held[i];
            rule.allowed_access = s->ll_held_dir[i] ? s->ll_dir_rights[i] : s->ll_file_rights[i];
            if (rule.allowed_access &&
                syscall(SYS_landlock_add_rule, ruleset, CELL_LANDLOCK_RULE_PATH_BENEATH, &rule, 0u) < 0)
                die(fd, ST_LANDLOCK, errno, "landlock: add_rule ", s->ll_paths[i], NULL);
            continue;
        }
        if (entry && !(strncmp(dir_path, path, dir_len) == 0 && dir_path[dir_len] == '\0')) {
            if (dir_fd >= 0) must_close(fd, dir_fd, ST_LANDLOCK, dir_path);
            memcpy(dir_path, path, dir_len);
            dir_path[dir_len] = '\0';
            dir_fd = open(dir_len ? dir_path : "/", O_PATH | O_DIRECTORY | O_CLOEXEC);
        }
        path_fd = entry && dir_fd >= 0 ? openat(dir_fd, slash + 1, O_PATH | O_CLOEXEC)
                                       : open(path, O_PATH | O_CLOEXEC);
        if (path_fd < 0) {
            /* EACCES: an entry of a granted directory the cell's uid cannot
             * even look up (a 0700 directory on the way); no rule, and file
             * permissions refuse it anyway. */
            if (errno == ENOENT || errno == ENOTDIR || errno == EACCES) continue;
            die(fd, ST_LANDLOCK, errno, "landlock: open ", s->ll_paths[i], NULL);
        }
        rule.parent_fd = path_fd;
        if ((s->ll_dir_rights[i] & ~LL_FILE_RIGHTS) != 0) {
            /* Rights only a directory can have: landlock_add_rule(2) refuses
             * them on anything else (EINVAL, "Files only get access rights
             * that make sense": security/landlock/fs.c), which tells a file
             * from a directory without an fstat. */
            rule.allowed_access = s->ll_dir_rights[i];
            if (syscall(SYS_landlock_add_rule, ruleset, CELL_LANDLOCK_RULE_PATH_BENEATH, &rule, 0u) == 0)
                added = 1;
            else if (errno != EINVAL)
                die(fd, ST_LANDLOCK, errno, "landlock: add_rule ", s->ll_paths[i], NULL);
            else
                rule.allowed_access = s->ll_file_rights[i];
        } else {
            if (fstat(path_fd, &st) < 0) die(fd, ST_LANDLOCK, errno, "landlock: stat ", s->ll_paths[i], NULL);
            rule.allowed_access = S_ISDIR(st.st_mode) ? s->ll_dir_rights[i] : s->ll_file_rights[i];
        }
        if (!added && rule.allowed_access &&
            syscall(SYS_landlock_add_rule, ruleset, CELL_LANDLOCK_RULE_PATH_BENEATH, &rule, 0u) < 0)
            die(fd, ST_LANDLOCK, errno, "landlock: add_rule ", s->ll_paths[i], NULL);
        /* Left open, a few hundred at most: close_except closes them all in
         * one close_range before the command runs (a close each was 0.3 ms
         * of a default cell's start). */
        if (path_fd >= open_max) must_close(fd, path_fd, ST_LANDLOCK, s->ll_paths[i]);
    }
    if (dir_fd >= 0) must_close(fd, dir_fd, ST_LANDLOCK, dir_path);
    for (size_t i = 0; i < s->n_ll_ports; i++)
        if (syscall(SYS_landlock_add_rule, ruleset, CELL_LANDLOCK_RULE_NET_PORT, &s->ll_ports[i], 0u) < 0)
            die(fd, ST_LANDLOCK, errno, "landlock: add_rule for a port", NULL);
    if (syscall(SYS_landlock_restrict_self, ruleset, s->ll_flags) < 0)
        die(fd, ST_LANDLOCK, errno, "landlock: restrict_self", NULL);
    must_close(fd, ruleset, ST_LANDLOCK, "the ruleset");
}

/* The filter that sends connect(2) to the supervisor (_unotify.py), loaded
 * with SECCOMP_FILTER_FLAG_NEW_LISTENER (Linux 5.0): its listener is sent to
 * the parent over notify_sock (SCM_RIGHTS) and closed here, before anything of
 * the cell's runs, so that no process of the cell ever holds it (a process
 * holding its own listener could answer its own connects). In flight, the
 * descriptor keeps the listener alive until the parent receives it; a connect
 * made before that waits in the kernel. Once every copy is closed (the
 * supervisor ended), the filter's calls fail with ENOSYS: closed, not open. */
static void hand_over_listener(int fd, const struct spec *s) {
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } control;
    struct msghdr msg;
    struct iovec iov;
    struct cmsghdr *cmsg;
    char byte = 'L';
    int listener;
    if (s->notify.len == 0) return;
    listener = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &s->notify);
    if (listener < 0) die(fd, ST_SECCOMP, errno, "seccomp user notification", NULL);
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
    memcpy(CMSG_DATA(cmsg), &listener, sizeof(int));
    while (sendmsg(s->notify_sock, &msg, MSG_NOSIGNAL) < 0)
        if (errno != EINTR) die(fd, ST_SECCOMP, errno, "sending the notification listener", NULL);
    must_close(fd, listener, ST_SECCOMP, "the notification listener");
    must_close(fd, s->notify_sock, ST_SECCOMP, "the notification socket");
}

static void close_fds(int fd, unsigned int low, unsigned int high) {
    /* close_range(2), Linux 5.9: older than mount_setattr, which the view needs anyway. */
    if (low <= high && syscall(SYS_close_range, low, high, 0u) < 0)
        die(fd, ST_PREPARING, errno, "close_range", NULL);
}

/* Close every descriptor from 3 up except those in keep (sorted) and extra. */
static void close_except(int status_fd, const int *keep, size_t n_keep, int extra) {
    unsigned int low = 3;
    size_t k = 0;
    int extra_done = extra < 0;
    for (;;) {
        int next;
        if (k < n_keep && (extra_done || keep[k] <= extra))
            next = keep[k++];
        else if (!extra_done) {
            next = extra;
            extra_done = 1;
        } else
            break;
        if (next < 0 || (unsigned int)next < low) continue; /* stdio, or a duplicate */
        close_fds(status_fd, low, (unsigned int)next - 1);
        low = (unsigned int)next + 1;
    }
    close_fds(status_fd, low, ~0u);
}

/* execvpe(3) as Python's os.execvpe does it: a name with a slash is run as is;
 * otherwise each directory of the cell's PATH is tried, and the error reported
 * is the first that is not ENOENT/ENOTDIR, else the last. No sh fallback on
 * ENOEXEC. */
__attribute__((noreturn)) static void exec_command(int fd, const struct spec *s) {
    const char *file = s->argv[0];
    const char *dir = s->search_path;
    char full[PATH_MAX];
    int saved = 0, last = ENOENT;
    if (strchr(file, '/') != NULL) {
        execve(file, s->argv, s->envp);
        die(fd, ST_EXEC, errno, file, NULL);
    }
    for (;;) {
        const char *end = strchrnul(dir, ':');
        size_t dlen = (size_t)(end - dir), flen = strlen(file);
        int err;
        /* os.path.join(dir, file): nothing added after an empty dir or a trailing slash. */
        size_t sep = (dlen > 0 && dir[dlen - 1] != '/') ? 1 : 0;
        if (dlen + sep + flen >= sizeof full) {
            err = ENAMETOOLONG;
        } else {
            memcpy(full, dir, dlen);
            if (sep) full[dlen] = '/';
            memcpy(full + dlen + sep, file, flen + 1);
            execve(full, s->argv, s->envp);
            err = errno;
        }
        last = err;
        if (err != ENOENT && err != ENOTDIR && saved == 0) saved = err;
        if (*end == '\0') break;
        dir = end + 1;
    }
    die(fd, ST_EXEC, saved ? saved : last, file, NULL);
}

struct init_args {
    struct spec *spec;
    int status_w;
    pid_t pid; /* C2's host pid, written by clone(CLONE_PARENT_SETTID) before C2 runs */
    sigset_t mask; /* the caller's signal mask, which the command gets back */
};

/* The command's side (C3): what it needs of a process of its own, then exec.
 * It shares the init's memory until its exec (CLONE_VM | CLONE_VFORK), and the
 * init sleeps meanwhile. */
static int cell_command(void *arg) {
    const struct init_args *a = arg;
    const int fd = a->status_w;
    /* A process group of its own, as tini makes for its child: what the
     * command signals as "its group" (kill(0, ...), a shell's job control)
     * never includes the init. */
    if (setpgid(0, 0) < 0) die(fd, ST_PREPARING, errno, "setpgid of the command", NULL);
    if (sigprocmask(SIG_SETMASK, &a->mask, NULL) < 0) die(fd, ST_PREPARING, errno, "signal mask", NULL);
    exec_command(fd, a->spec);
}

/* The exit status a shell reports: the code, or 128+N when signal N killed it. */
static int shell_status(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

/* The init's life once the command runs (docker --init, tini): every signal
 * stays blocked and is taken with sigwaitinfo, SIGCHLD reaps every child
 * (the command and the orphans the pid namespace hands to pid 1), any other
 * signal is passed on to the command, and when the command ends the init
 * exits with its status, upon which the kernel kills what is left of the pid
 * namespace. The kernel drops a signal to a pid 1 with no handler for it, but
 * not one it blocks, so SIGTERM from the host (run.stop) reaches the command.
 * Only raw syscalls: no errno is kept across them. */
__attribute__((noreturn)) static void init_loop(pid_t command, const sigset_t *all) {
    for (;;) {
        siginfo_t info;
        int status;
        pid_t pid;
        if (sigwaitinfo(all, &info) < 0) continue; /* EINTR: a stop and continue */
        if (info.si_signo != SIGCHLD) {
            /* To the command alone, as tini does without -g; it passes it on
             * to its own children if it wants them to know. */
            (void)kill(command, info.si_signo);
            continue;
        }
        while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
            if (pid == command) _exit(shell_status(status));
    }
}

#include "_session_init.h"

static int cell_init(void *arg) {
    struct init_args *a = arg;
    struct spec *s = a->spec;
    const int fd = a->status_w;
    struct line l = {.len = 0};
    sigset_t all;
    char *stack;
    pid_t command;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die(fd, ST_PREPARING, errno, "death signal", NULL);
    /* pid 1 tells the parent its own host pid, which getpid() cannot give it
     * here (C1 could, but it no longer waits for this process to exec). */
    put_char(&l, 'P');
    put_int(&l, a->pid);
    put_char(&l, '\n');
    if (write_all(fd, l.buf, l.len) < 0) _exit(127);
    /* Its name in ps and /proc/1/comm (it never execs: it would read as the
     * launcher's interpreter). */
    (void)prctl(PR_SET_NAME, "stockade-init", 0, 0, 0);
    /* The view's directories and files must not depend on the caller's umask
     * (under 077 the agent could not read its own view); the command gets
     * the usual 022. */
    umask(022);
    build_view(fd, s);
    if (sethostname("stockade", 8) < 0) die(fd, ST_HOSTNAME, errno, "sethostname", NULL);
    loopback_up(fd);
    if (chdir(s->workdir) < 0) die(fd, ST_WORKDIR, errno, "workdir ", s->workdir, NULL);
    drop_privileges(fd, s->cap_last, s->keep_caps);
    /* The init is inside every layer it gives the command: it creates the
     * Landlock domain (the audit reader attributes the domain to this pid)
     * and loads seccomp; a hijacked command that reached it would gain
     * nothing. */
    if (s->landlock) apply_landlock(fd, s);
    hand_over_listener(fd, s);
    /* Nothing the launcher holds may leak into the cell: keep 0-2, the status
     * pipe (close-on-exec: it reports exec errors) and keep_fds. */
    close_except(fd, s->keep, s->n_keep, fd);
    for (size_t i = 0; i < s->n_filters; i++)
        if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, s->filter_flags[i], &s->filters[i]) < 0)
            die(fd, ST_SECCOMP, errno, "seccomp", NULL);
    /* Blocked before the command exists, so that its SIGCHLD cannot be lost. */
    sigfillset(&all);
    if (sigprocmask(SIG_SETMASK, &all, NULL) < 0) die(fd, ST_PREPARING, errno, "signal mask of the init", NULL);
    if (s->session_fd >= 0) {
        /* Session mode: no command of its own; the calls come on the session
         * socket (kept by close_except as one of keep_fds). The status
         * pipe's EOF tells launch() the cell is ready. */
        (void)close(fd);
        session_loop(s, s->session_fd, &all, &a->mask);
    }
    stack = mmap(NULL, INIT_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) die(fd, ST_PREPARING, errno, "stack of the command", NULL);
    if (mprotect(stack, (size_t)getpagesize(), PROT_NONE) < 0)
        die(fd, ST_PREPARING, errno, "guard page of the command", NULL);
    command = clone(cell_command, stack + INIT_STACK, CLONE_VM | CLONE_VFORK | SIGCHLD, a);
    if (command < 0) die(fd, ST_PREPARING, errno, "clone of the command", NULL);
    /* The command has exec'd (or failed to, and said so on the pipe): the
     * init keeps only its stdio (a cell's output ends when the command's
     * does, and the init ends with it) and closes the status pipe last, so
     * that the EOF launch() waits for also means that nothing else of the
     * launcher's is open. */
    (void)syscall(SYS_close_range, 3u, (unsigned int)fd - 1, 0u);
    (void)syscall(SYS_close_range, (unsigned int)fd + 1, ~0u, 0u);
    (void)close(fd);
    init_loop(command, &all);
}

/* --------------------------------------------------------------- C1 */

static pid_t cell_fork(void) {
    /* _Fork (glibc 2.34) runs no atfork handlers and takes no malloc locks: the
     * children use neither, and another thread of the parent may hold them. */
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)
    return _Fork();
#else
    return fork();
#endif
}

/* ------------------------------------------- the children's copy of the parent */

/* C1 is a fork of the caller, and lives as long as its cell: every page of the
 * caller's memory it copies costs a page-table copy at the fork, a
 * copy-on-write fault each time the caller (a busy Python process: reference
 * counts are writes) touches that page while the cell runs, and an unmap at
 * C1's exit. Measured on a default cell's /bin/true, that was about 3 ms of
 * CPU of a launch from a small process and 15 ms from one of 250 MB, most of
 * it in the caller's faults (issue 18). The children touch none of it: they
 * run this file's code on their own stacks, make only syscalls through the C
 * library, and read nothing but the spec, whose every byte lives in its own
 * chunks (spec_alloc). So before the fork, every writable mapping (private
 * or shared) is marked MADV_DONTFORK but for the parts they need, and marked
 * back right after: the children never have the Python heap, the
 * interpreter's data, other libraries' data, or the caller's secrets.
 *
 * The parts they need: the spec's chunks, the calling thread's stack around
 * its stack pointer (C1 runs on it until it clones C2) and the thread-local
 * storage around its thread pointer (errno, the stack guard), and the
 * writable segments (.data, .bss) of this module, the C library and the
 * dynamic loader. Anything else the children touched would fault them
 * (SIGSEGV: the caller sees a cell that died in setup), never leak or change
 * the caller's memory.
 *
 * The GIL is held from the first madvise to the last, so no Python thread
 * forks meanwhile (a fork then would leave its child without a heap); no C
 * thread of this process forks. Where /proc/self/maps cannot be read, the
 * fork copies everything, as before. Written by hand: no library marks a
 * fork's share of memory. */

#define LEAN_MAPS_MAX (1 << 22) /* /proc/self/maps of a very large process: 4 MiB */

struct lean {
    uintptr_t *lo, *hi; /* what was marked, to mark back */
    size_t n, cap;
};

struct map_line {
    uintptr_t lo, hi;
    int writable;
    const char *name; /* "" for an anonymous mapping; not NUL-terminated: ends at the line's end */
};

static const char *parse_hex(const char *p, const char *end, uintptr_t *out) {
    uintptr_t v = 0;
    int any = 0;
    for (; p < end; p++, any = 1) {
        int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
        if (d < 0) break;
        v = v * 16 + (uintptr_t)d;
    }
    *out = v;
    return any ? p : NULL;
}

static const char *parse_dec(const char *p, const char *end, unsigned long *out) {
    unsigned long v = 0;
    int any = 0;
    for (; p < end && *p >= '0' && *p <= '9'; p++, any = 1) v = v * 10 + (unsigned long)(*p - '0');
    *out = v;
    return any ? p : NULL;
}

/* One line of /proc/self/maps: "lo-hi perms offset major:minor inode   name". */
static int parse_map_line(const char *p, const char *end, struct map_line *m) {
    uintptr_t major, minor, offset;
    unsigned long inode;
    if ((p = parse_hex(p, end, &m->lo)) == NULL || p >= end || *p++ != '-') return -1;
    if ((p = parse_hex(p, end, &m->hi)) == NULL || end - p < 6 || *p++ != ' ') return -1;
    m->writable = p[1] == 'w';
    p += 4;
    if (p >= end || *p++ != ' ' || (p = parse_hex(p, end, &offset)) == NULL || p >= end || *p++ != ' ') return -1;
    if ((p = parse_hex(p, end, &major)) == NULL || p >= end || *p++ != ':') return -1;
    if ((p = parse_hex(p, end, &minor)) == NULL || p >= end || *p++ != ' ') return -1;
    if ((p = parse_dec(p, end, &inode)) == NULL) return -1;
    while (p < end && *p == ' ') p++;
    m->name = p;
    return 0;
}

static char *read_maps(size_t *len) {
    size_t cap = 64 * 1024, got = 0;
    char *buf = NULL;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    for (;;) {
        ssize_t n;
        if (buf == NULL || got == cap) {
            char *grown;
            if (buf != NULL) cap *= 2;
            if (cap > LEAN_MAPS_MAX || (grown = PyMem_Realloc(buf, cap)) == NULL) {
                PyMem_Free(buf);
                close(fd);
                return NULL;
            }
            buf = grown;
        }
        n = read(fd, buf + got, cap - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            PyMem_Free(buf);
            close(fd);
            return NULL;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    *len = got;
    return buf;
}

static uintptr_t thread_pointer(void) {
#if defined(__x86_64__)
    uintptr_t tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp)); /* the TCB's self pointer (glibc, musl) */
    return tp;
#else
    return (uintptr_t)__builtin_thread_pointer();
#endif
}

static void lean_add(struct lean *l, uintptr_t lo, uintptr_t hi) {
    if (lo < hi && l->n < l->cap && madvise((void *)lo, hi - lo, MADV_DONTFORK) == 0) {
        l->lo[l->n] = lo;
        l->hi[l->n++] = hi;
    }
}

#define LEAN_KEPT_MAX 64

struct kept_parts {
    uintptr_t lo[LEAN_KEPT_MAX], hi[LEAN_KEPT_MAX];
    /* A window around an address (the stack, the TLS) holds only in the
     * mapping that address is in, never in a neighbour it reaches into
     * (another thread's stack, a shared mapping); 0: an exact range. */
    uintptr_t anchor[LEAN_KEPT_MAX];
    size_t n;
    int overflow;
    uintptr_t objects[3]; /* an address in each object whose writable segments are kept */
};

static void keep_part(struct kept_parts *k, uintptr_t lo, uintptr_t hi, uintptr_t anchor) {
    uintptr_t page = (uintptr_t)getpagesize();
    if (k->n == LEAN_KEPT_MAX) {
        k->overflow = 1;
        return;
    }
    k->anchor[k->n] = anchor;
    k->lo[k->n] = lo & ~(page - 1);
    k->hi[k->n++] = (hi + page - 1) & ~(page - 1);
}

/* The writable segments (.data, .bss: PT_LOAD with PF_W, p_memsz long) of the
 * objects the children run: this module, the C library, the dynamic loader. */
static int keep_segments(struct dl_phdr_info *info, size_t size, void *arg) {
    struct kept_parts *k = arg;
    int ours = 0;
    (void)size;
    for (int i = 0; i < info->dlpi_phnum && !ours; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (ph->p_type != PT_LOAD) continue;
        for (int o = 0; o < 3; o++)
            if (k->objects[o] >= lo && k->objects[o] < hi) ours = 1;
    }
    for (int i = 0; i < info->dlpi_phnum && ours; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_W))
            keep_part(k, info->dlpi_addr + ph->p_vaddr, info->dlpi_addr + ph->p_vaddr + ph->p_memsz, 0);
    }
    return 0;
}

/* Mark a mapping but the parts the children need. Those are cut out, not
 * kept with their whole mapping: the kernel merges an anonymous mapping with
 * its neighbours, so a spec chunk, a thread's stack or a library's .bss may
 * share one with the Python heap. */
static void lean_mark(struct lean *l, const struct map_line *m, const struct kept_parts *k) {
    uintptr_t at = m->lo;
    while (at < m->hi) {
        /* The next kept part from at on: cut up to it, skip past it. */
        uintptr_t next_lo = m->hi, next_hi = m->hi;
        for (size_t i = 0; i < k->n; i++)
            if (k->hi[i] > at && k->lo[i] < next_lo &&
                (k->anchor[i] == 0 || (k->anchor[i] >= m->lo && k->anchor[i] < m->hi))) {
                next_lo = k->lo[i] > at ? k->lo[i] : at;
                next_hi = k->hi[i];
            }
        lean_add(l, at, next_lo < m->hi ? next_lo : m->hi);
        at = next_hi;
    }
}

/* Mark what the children need not copy; fills l (empty when nothing was marked). */
static void lean_begin(struct lean *l, const struct spec *s) {
    struct map_line m;
    struct kept_parts k;
    uintptr_t sp = (uintptr_t)&m, tp = thread_pointer();
    size_t len, lines = 0, found = 0;
    char *buf, *end;
    l->lo = l->hi = NULL;
    l->n = l->cap = 0;
    memset(&k, 0, sizeof k);
    /* Below sp: C1's own frames until it clones C2, never deep (its largest
     * buffer is a report line); above it, what the call chain left. */
    keep_part(&k, sp - 256 * 1024, sp + 64 * 1024, sp);
    /* The TCB (glibc, musl: at the thread pointer) and the static TLS below it. */
    keep_part(&k, tp - 64 * 1024, tp + 16 * 1024, tp);
    for (size_t i = 0; i < s->n_allocs; i++)
        keep_part(&k, (uintptr_t)s->allocs[i], (uintptr_t)s->allocs[i] + s->alloc_sizes[i], 0);
    k.objects[0] = (uintptr_t)&lean_begin;
    k.objects[1] = (uintptr_t)&open;
    k.objects[2] = (uintptr_t)getauxval(AT_BASE);
    {
        size_t before = k.n;
        dl_iterate_phdr(keep_segments, &k);
        found = k.n - before;
    }
    if (k.overflow || found < 2 || (buf = read_maps(&len)) == NULL) return; /* copy everything */
    end = buf + len;
    for (char *p = buf; p < end; p++)
        if (*p == '\n') lines++;
    /* Each mapping is cut in at most as many pieces as there are kept parts, plus one. */
    l->cap = (lines + 1) * (k.n + 1);
    l->lo = PyMem_Malloc(l->cap * sizeof *l->lo);
    l->hi = PyMem_Malloc(l->cap * sizeof *l->hi);
    if (l->lo == NULL || l->hi == NULL) goto done;
    for (char *p = buf; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (nl == NULL) nl = end;
        /* The heap and the main thread's stack are marked like any other
         * (the calling thread keeps its part: the window around sp); the
         * kernel's own ([vvar], [vdso]) and a named [anon:...] are left alone. */
        if (parse_map_line(p, nl, &m) == 0 && m.writable &&
            !(m.name != nl && m.name[0] == '[' && !(nl - m.name == 6 && memcmp(m.name, "[heap]", 6) == 0) &&
              !(nl - m.name == 7 && memcmp(m.name, "[stack]", 7) == 0)))
            lean_mark(l, &m, &k);
        p = nl + 1;
    }
done:
    PyMem_Free(buf);
}

static void lean_end(struct lean *l) {
    /* Unmapped or remapped meanwhile by another thread: madvise fails on the
     * gap (ENOMEM) and DOFORK is the default anyway. */
    for (size_t i = 0; i < l->n; i++) (void)madvise((void *)l->lo[i], l->hi[i] - l->lo[i], MADV_DOFORK);
    PyMem_Free(l->lo);
    PyMem_Free(l->hi);
    l->lo = l->hi = NULL;
    l->n = 0;
}

static int above_stdio(int fd) {
    /* A descriptor in 0-2 would be overwritten by the dup2s below. */
    return fd < 3 ? fcntl(fd, F_DUPFD_CLOEXEC, 3) : fd;
}

__attribute__((noreturn)) static void first_child(struct spec *s, const sigset_t *mask) {
    int fd = s->status_w, go = s->go_r, status;
    int src[3];
    struct init_args args;
    char *stack;
    pid_t pid;
    char g;
    ssize_t got;
    /* C1 never execs, so O_CLOEXEC never closes what it inherited, and it
     * lives as long as the cell: it keeps only what it and C2 need (the
     * pipes, stdio sources, idmap user namespaces, Landlock rule descriptors,
     * keep_fds), never the caller's other files, sockets, or the pipes of
     * cells launched meanwhile (whose EOF it would hold back). */
    close_except(fd, s->c1_keep, s->n_c1_keep, -1);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die(fd, ST_PREPARING, errno, "death signal", NULL);
    if (getppid() != s->parent) _exit(127); /* the parent died before we could watch it */
    /* The parent's handlers are meaningless here (and Python's would write to
     * its wakeup fd); the defaults make the cell killable. Ignored signals stay
     * ignored across exec, as with the Python launcher, except SIGPIPE. */
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction sa;
        if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) < 0) continue;
        if (sa.sa_handler == SIG_DFL) continue;
        if (sa.sa_handler == SIG_IGN && sig != SIGINT && sig != SIGTERM && sig != SIGPIPE && sig != SIGCHLD)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_DFL;
        if (sigaction(sig, &sa, NULL) < 0) die(fd, ST_PREPARING, errno, "resetting signals", NULL);
    }
    if (sigprocmask(SIG_SETMASK, mask, NULL) < 0) die(fd, ST_PREPARING, errno, "signal mask", NULL);
    if (setsid() < 0) die(fd, ST_PREPARING, errno, "setsid", NULL); /* no controlling tty: no TIOCSTI */
    if ((fd = above_stdio(fd)) < 0 || (go = above_stdio(go)) < 0)
        die(s->status_w, ST_PREPARING, errno, "moving the pipes", NULL);
    for (int i = 0; i < 3; i++) {
        src[i] = s->stdio[i];
        if (src[i] < 3 && src[i] != i && (src[i] = above_stdio(src[i])) < 0)
            die(fd, ST_PREPARING, errno, "moving stdio", NULL);
    }
    for (int i = 0; i < 3; i++)
        if (src[i] != i && dup2(src[i], i) < 0) die(fd, ST_PREPARING, errno, "dup2 of stdio", NULL);
    if (s->loginuid[0]) {
        /* Its own audit session: every kernel record of the cell carries ses=. */
        int file = open("/proc/self/loginuid", O_WRONLY | O_CLOEXEC);
        if (file < 0 || write_all(file, s->loginuid, strlen(s->loginuid)) < 0)
            die(fd, ST_AUDIT, errno, "/proc/self/loginuid", NULL);
        must_close(fd, file, ST_AUDIT, "/proc/self/loginuid");
    }
    for (size_t i = 0; i < s->n_cgroups; i++) {
        int file = open(s->cgroups[i], O_WRONLY | O_CLOEXEC);
        if (file < 0 || write_all(file, "0", 1) < 0) die(fd, ST_CGROUPS, errno, s->cgroups[i], NULL);
        must_close(fd, file, ST_CGROUPS, s->cgroups[i]);
    }
    /* Detached copies (open_tree) of every host path the view binds, made while
     * this process is still host root: the cell's pid 1 acts as an
     * unprivileged host uid and could not traverse a 0700 parent directory.
     * Writable grants of another owner are idmapped here (only the initial
     * namespace may idmap an ext4 mount). */
    for (size_t i = 0; i < s->n_ops; i++) {
        struct op *op = &s->ops[i];
        struct cell_mount_attr attr = {.attr_set = CELL_MOUNT_ATTR_NOSUID | CELL_MOUNT_ATTR_NODEV};
        struct stat st;
        int tree;
        if (op->kind == K_OVERLAY) {
            /* The image, read-only, and the run's upper: both idmapped (the
             * image's ids on disk are the cell's inside) while this is host root. */
            struct cell_mount_attr lower = {.attr_set = CELL_MOUNT_ATTR_NOSUID | CELL_MOUNT_ATTR_NODEV |
                                                        CELL_MOUNT_ATTR_RDONLY | CELL_MOUNT_ATTR_IDMAP,
                                            .userns_fd = (uint64_t)op->userns_fd};
            struct cell_mount_attr upper = lower;
            upper.attr_set &= ~(uint64_t)CELL_MOUNT_ATTR_RDONLY;
            op->tree_fd = (int)syscall(SYS_open_tree, AT_FDCWD, op->src, CELL_OPEN_TREE_CLONE | O_CLOEXEC);
            if (op->tree_fd < 0) die(fd, ST_GRANTS, errno, "open_tree of the image ", op->src, NULL);
            if (syscall(SYS_mount_setattr, op->tree_fd, "", AT_EMPTY_PATH, &lower, sizeof lower) < 0)
                die(fd, ST_GRANTS, errno, "idmapping the image ", op->src, NULL);
            op->upper_fd = (int)syscall(SYS_open_tree, AT_FDCWD, op->data, CELL_OPEN_TREE_CLONE | O_CLOEXEC);
            if (op->upper_fd < 0) die(fd, ST_GRANTS, errno, "open_tree of the upper layer ", op->data, NULL);
            if (syscall(SYS_mount_setattr, op->upper_fd, "", AT_EMPTY_PATH, &upper, sizeof upper) < 0)
                die(fd, ST_GRANTS, errno, "idmapping the upper layer ", op->data, NULL);
            continue;
        }
        if (op->tmpl_fd >= 0) {
            op->tree_fd = (int)syscall(SYS_open_tree, op->tmpl_fd, "",
                                       CELL_OPEN_TREE_CLONE | AT_EMPTY_PATH | O_CLOEXEC);
            if (op->tree_fd < 0) die(fd, ST_GRANTS, errno, "open_tree of the decoy ", op->dst, NULL);
            must_close(fd, op->tmpl_fd, ST_GRANTS, op->dst);
            continue;
        }
        if (op->kind != K_BIND || op->from_view) continue;
        tree = (int)syscall(SYS_open_tree, AT_FDCWD, op->src, CELL_OPEN_TREE_CLONE | O_CLOEXEC);
        if (tree < 0) {
            if (errno == ENOENT || errno == ENOTDIR) continue; /* gone since planning */
            die(fd, ST_GRANTS, errno, "open_tree ", op->src, NULL);
        }
        /* A read grant is a read-write mount (Landlock refuses writes, and so
         * records them) unless the plan asks otherwise: see _plan._read_mount. */
        if (!op->writable) attr.attr_set |= CELL_MOUNT_ATTR_RDONLY;
        if (op->userns_fd >= 0) {
            attr.attr_set |= CELL_MOUNT_ATTR_IDMAP;
            attr.userns_fd = (uint64_t)op->userns_fd;
        }
        if (syscall(SYS_mount_setattr, tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
            die(fd, ST_GRANTS, errno, "mount attributes of ", op->src, NULL);
        if (fstat(tree, &st) < 0) die(fd, ST_GRANTS, errno, "stat ", op->src, NULL);
        op->tree_fd = tree;
        op->tree_is_dir = S_ISDIR(st.st_mode);
    }
    /* Raw syscalls: they change this thread only, which is all there is. */
    if (geteuid() == 0 && syscall(SYS_setgroups, 0, NULL) < 0)
        die(fd, ST_PREPARING, errno, "setgroups", NULL);
    if (s->owner_uid >= 0) {
        /* The kernel charges a user namespace's per-user counters (inotify
         * instances and watches, fanotify groups, queued signals, user
         * namespaces: kernel/ucount.c) up the chain to the uid that created
         * it. Created by host root, a cell would use up root's. Created by an
         * unprivileged uid of the cell's own, it uses up that uid's, and
         * nothing of root's or another cell's. Everything that needs host
         * root (the grants' trees, cgroups, the audit session) is done above;
         * the parent, still root, writes the maps. */
        if (syscall(SYS_setresgid, s->owner_gid, s->owner_gid, s->owner_gid) < 0)
            die(fd, ST_PREPARING, errno, "setresgid to the namespace's owner", NULL);
        if (syscall(SYS_setresuid, s->owner_uid, s->owner_uid, s->owner_uid) < 0)
            die(fd, ST_PREPARING, errno, "setresuid to the namespace's owner", NULL);
        /* A change of uid clears the parent-death signal (prctl(2)). */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die(fd, ST_PREPARING, errno, "death signal", NULL);
        if (getppid() != s->parent) _exit(127);
    }
    if (unshare(CELL_NAMESPACES) < 0) die(fd, ST_UNSHARE, errno, "unshare namespaces", NULL);
    if (write_all(fd, "U\n", 2) < 0) _exit(127);
    do got = read(go, &g, 1);
    while (got < 0 && errno == EINTR);
    if (got != 1 || g != 'G') _exit(127); /* the parent gave up */
    must_close(fd, go, ST_PREPARING, "the go pipe");
    if (syscall(SYS_setresgid, s->cell_gid, s->cell_gid, s->cell_gid) < 0)
        die(fd, ST_PREPARING, errno, "setresgid", NULL);
    if (syscall(SYS_setresuid, s->cell_uid, s->cell_uid, s->cell_uid) < 0)
        die(fd, ST_PREPARING, errno, "setresuid", NULL);
    /* prctl(2): a change of effective uid or gid clears the parent-death
     * signal. Arm it again, or a SIGKILLed daemon would leave this cell
     * running; and check the parent did not die in between. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) die(fd, ST_PREPARING, errno, "death signal", NULL);
    if (getppid() != s->parent) _exit(127);
    /* C2, the cell's init, shares C1's memory (CLONE_VM): no second copy of
     * the parent's page tables. It never execs (it forks the command, C3, and
     * stays), so C1 cannot sleep in a vfork until it does; instead, once
     * clone returns, C1 makes only raw syscalls that touch nothing the two
     * share (close_range, wait4, exit: no errno is read, no stack but its
     * own), while C2 runs on a stack of its own with a guard page below it. */
    stack = mmap(NULL, INIT_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) die(fd, ST_PREPARING, errno, "stack of the cell's init", NULL);
    if (mprotect(stack, (size_t)getpagesize(), PROT_NONE) < 0)
        die(fd, ST_PREPARING, errno, "guard page of the cell's init", NULL);
    args.spec = s;
    args.status_w = fd;
    args.pid = 0;
    args.mask = *mask;
    pid = clone(cell_init, stack + INIT_STACK, CLONE_VM | CLONE_PARENT_SETTID | SIGCHLD, &args, &args.pid);
    if (pid < 0) die(fd, ST_PREPARING, errno, "clone of the cell's init", NULL);
    /* C1 only waits now, and holds nothing for the cell's lifetime (C2 has a
     * copy of every descriptor it needs). */
    (void)syscall(SYS_close_range, 0u, ~0u, 0u);
    while (syscall(SYS_wait4, pid, &status, 0, NULL) < 0) {
    }
    syscall(SYS_exit_group, shell_status(status));
    __builtin_unreachable();
}

/* ------------------------------------------- parent side: Python to C, fork */

#define ARENA_CHUNK (64 * 1024)

static void *spec_alloc(struct spec *s, size_t count, size_t size) {
    /* Zeroed memory (as calloc) from the spec's own mmap'd chunks: fresh
     * anonymous pages, handed out once each, freed together by spec_free. */
    size_t need;
    char *p;
    if (count == 0) count = 1;
    if (size == 0) size = 1;
    if (count > SIZE_MAX / size || count * size > SIZE_MAX - 4 * ARENA_CHUNK) return PyErr_NoMemory();
    need = (count * size + 15) & ~(size_t)15;
    if ((size_t)(s->arena_end - s->arena_at) < need) {
        size_t chunk = need > ARENA_CHUNK ? (need + ARENA_CHUNK - 1) & ~(size_t)(ARENA_CHUNK - 1) : ARENA_CHUNK;
        if (s->n_allocs == s->cap_allocs) {
            size_t cap = s->cap_allocs ? s->cap_allocs * 2 : 8;
            void **grown = PyMem_Realloc(s->allocs, cap * sizeof *grown);
            size_t *sizes;
            if (grown == NULL) return PyErr_NoMemory();
            s->allocs = grown;
            if ((sizes = PyMem_Realloc(s->alloc_sizes, cap * sizeof *sizes)) == NULL) return PyErr_NoMemory();
            s->alloc_sizes = sizes;
            s->cap_allocs = cap;
        }
        p = mmap(NULL, chunk, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return PyErr_NoMemory();
        s->allocs[s->n_allocs] = p;
        s->alloc_sizes[s->n_allocs++] = chunk;
        s->arena_at = p;
        s->arena_end = p + chunk;
    }
    p = s->arena_at;
    s->arena_at += need;
    return p;
}

static char *spec_strdup(struct spec *s, const char *text, size_t len) {
    char *copy = spec_alloc(s, len + 1, 1);
    if (copy != NULL) memcpy(copy, text, len);
    return copy;
}

static void spec_free(struct spec *s) {
    for (size_t i = 0; i < s->n_allocs; i++) munmap(s->allocs[i], s->alloc_sizes[i]);
    PyMem_Free(s->allocs);
    PyMem_Free(s->alloc_sizes);
    Py_CLEAR(s->owned);
}

/* A str, bytes or os.PathLike as a NUL-free C string shorter than PATH_ROOM. */
static const char *to_path(struct spec *s, PyObject *obj, const char *what, Py_ssize_t index, int absolute) {
    PyObject *bytes = NULL;
    const char *text;
    if (!PyUnicode_FSConverter(obj, &bytes)) return NULL; /* TypeError, or ValueError: embedded NUL */
    if (PyList_Append(s->owned, bytes) < 0) {
        Py_DECREF(bytes);
        return NULL;
    }
    Py_DECREF(bytes);
    text = PyBytes_AS_STRING(bytes);
    if (PyBytes_GET_SIZE(bytes) >= PATH_ROOM) {
        PyErr_Format(PyExc_ValueError, "%s[%zd] is longer than %d bytes", what, index, PATH_ROOM);
        return NULL;
    }
    if (absolute && text[0] != '/') {
        PyErr_Format(PyExc_ValueError, "%s[%zd] must be an absolute path, not %R", what, index, obj);
        return NULL;
    }
    return spec_strdup(s, text, (size_t)PyBytes_GET_SIZE(bytes));
}

static int to_long(PyObject *obj, long lo, long hi, const char *what, long *out) {
    long value;
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.80s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    value = PyLong_AsLong(obj);
    if ((value == -1 && PyErr_Occurred()) || value < lo || value > hi) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be between %ld and %ld, not %R", what, lo, hi, obj);
        return -1;
    }
    *out = value;
    return 0;
}

static int to_u64(PyObject *obj, const char *what, uint64_t *out) {
    unsigned long long value;
    if (!PyLong_Check(obj) || PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.80s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    value = PyLong_AsUnsignedLongLong(obj);
    if (value == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be an unsigned 64-bit int, not %R", what, obj);
        return -1;
    }
    *out = value;
    return 0;
}

static int to_bool(PyObject *obj, const char *what, Py_ssize_t index, int *out) {
    if (!PyBool_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s[%zd] must be a bool, not %.80s", what, index,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    *out = obj == Py_True;
    return 0;
}

static int tuple_of(PyObject *obj, const char *what, Py_ssize_t size) {
    if (!PyTuple_Check(obj) || (size >= 0 && PyTuple_GET_SIZE(obj) != size)) {
        if (size >= 0)
            PyErr_Format(PyExc_TypeError, "%s must be a tuple of %zd items, not %.80s", what, size,
                         Py_TYPE(obj)->tp_name);
        else
            PyErr_Format(PyExc_TypeError, "%s must be a tuple, not %.80s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

static int plain_relative(const char *name, size_t len) {
    size_t start = 0;
    if (len == 0) return 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && name[i] != '/') continue;
        if (i == start || (i - start == 1 && name[start] == '.') ||
            (i - start == 2 && name[start] == '.' && name[start + 1] == '.'))
            return 0; /* empty (leading or doubled slash), "." or ".." */
        start = i + 1;
    }
    return 1;
}

/* (kind, dst, src, writable, data, names, userns_fd, from_view) */
static int parse_op(struct spec *s, PyObject *item, Py_ssize_t i, struct op *op) {
    PyObject *names;
    Py_ssize_t n;
    long userns;
    char *data;
    Py_ssize_t data_len;
    if (tuple_of(item, "each mount", 8) < 0) return -1;
    op->kind = -1;
    op->tree_fd = op->tmpl_fd = -1;
    for (int k = 0; k < K_COUNT && PyUnicode_Check(PyTuple_GET_ITEM(item, 0)); k++)
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(item, 0), KIND_NAMES[k]) == 0) op->kind = k;
    if (op->kind < 0) {
        PyErr_Format(PyExc_ValueError, "mounts[%zd] has an unknown kind %R", i, PyTuple_GET_ITEM(item, 0));
        return -1;
    }
    if ((op->dst = to_path(s, PyTuple_GET_ITEM(item, 1), "mounts.dst", i, 1)) == NULL) return -1;
    if ((op->src = to_path(s, PyTuple_GET_ITEM(item, 2), "mounts.src", i, op->kind == K_BIND)) == NULL)
        return -1;
    if (op->kind == K_SYMLINK && op->src[0] == '\0') {
        PyErr_Format(PyExc_ValueError, "mounts[%zd] is a symlink without a target", i);
        return -1;
    }
    if (to_bool(PyTuple_GET_ITEM(item, 3), "mounts.writable", i, &op->writable) < 0) return -1;
    if (!PyBytes_Check(PyTuple_GET_ITEM(item, 4))) {
        PyErr_Format(PyExc_TypeError, "mounts[%zd].data must be bytes", i);
        return -1;
    }
    if (PyBytes_AsStringAndSize(PyTuple_GET_ITEM(item, 4), &data, &data_len) < 0) return -1;
    if ((op->data = spec_strdup(s, data, (size_t)data_len)) == NULL) return -1;
    op->data_len = (size_t)data_len;
    names = PyTuple_GET_ITEM(item, 5);
    if (tuple_of(names, "mounts.names", -1) < 0) return -1;
    n = PyTuple_GET_SIZE(names);
    op->names = spec_alloc(s, (size_t)n, sizeof *op->names);
    op->name_is_dir = spec_alloc(s, (size_t)n, 1);
    if (op->names == NULL || op->name_is_dir == NULL) return -1;
    for (Py_ssize_t j = 0; j < n; j++) {
        const char *name = to_path(s, PyTuple_GET_ITEM(names, j), "mounts.names", j, 0);
        size_t len;
        char *copy;
        if (name == NULL) return -1;
        len = strlen(name);
        op->name_is_dir[j] = len > 1 && name[len - 1] == '/'; /* "name/" is a directory */
        len -= op->name_is_dir[j];
        /* A relative path of plain names (a decoy mirrors two levels): never
         * absolute, no "." or "..", nothing made outside dst. */
        if (!plain_relative(name, len)) {
            PyErr_Format(PyExc_ValueError, "mounts[%zd].names[%zd] is not a relative path of plain names: %R",
                         i, j, PyTuple_GET_ITEM(names, j));
            return -1;
        }
        if ((copy = spec_alloc(s, len + 1, 1)) == NULL) return -1;
        memcpy(copy, name, len);
        op->names[j] = copy;
    }
    op->n_names = (size_t)n;
    if (to_long(PyTuple_GET_ITEM(item, 6), -1, INT_MAX, "mounts.userns_fd", &userns) < 0) return -1;
    op->userns_fd = (int)userns;
    op->upper_fd = -1;
    if (op->kind == K_OVERLAY) {
        /* src: the image's rootfs; data: the upper's host directory (NUL-free,
         * absolute); names: (upper, work) inside it, or (copy,) where the
         * image is copied for the run instead; userns_fd: the id range. */
        if (op->src[0] != '/' || op->data_len == 0 || op->data[0] != '/' || op->data_len >= PATH_ROOM ||
            memchr(op->data, '\0', op->data_len) != NULL || n < 1 || n > 2 || op->name_is_dir[0] ||
            op->name_is_dir[n - 1] || strchr(op->names[0], '/') || strchr(op->names[n - 1], '/') ||
            strlen(op->names[0]) + strlen(op->names[n - 1]) > 512 || op->userns_fd < 0 || i != 0) {
            PyErr_Format(PyExc_ValueError,
                         "mounts[%zd] is an overlay without an absolute image and upper, the names of "
                         "its upper and work directories, and an id range, or not the first mount", i);
            return -1;
        }
    }
    return to_bool(PyTuple_GET_ITEM(item, 7), "mounts.from_view", i, &op->from_view);
}

/* (ruleset_attr, ready rules, (path, dir rights, file rights)..., ports, restrict flags) */
static int parse_landlock(struct spec *s, PyObject *ll) {
    PyObject *attr, *ready, *paths, *ports;
    long flags;
    if (ll == Py_None) return 0;
    if (tuple_of(ll, "landlock", 5) < 0) return -1;
    attr = PyTuple_GET_ITEM(ll, 0);
    ready = PyTuple_GET_ITEM(ll, 1);
    paths = PyTuple_GET_ITEM(ll, 2);
    ports = PyTuple_GET_ITEM(ll, 3);
    if (!PyBytes_Check(attr) || PyBytes_GET_SIZE(attr) == 0 || PyBytes_GET_SIZE(attr) > 24 ||
        PyBytes_GET_SIZE(attr) % 8) {
        PyErr_SetString(PyExc_ValueError, "landlock ruleset_attr must be 8, 16 or 24 bytes");
        return -1;
    }
    memcpy(s->ll_attr, PyBytes_AS_STRING(attr), (size_t)PyBytes_GET_SIZE(attr));
    s->ll_attr_len = (size_t)PyBytes_GET_SIZE(attr);
    if (tuple_of(ready, "landlock rules", -1) < 0 || tuple_of(paths, "landlock paths", -1) < 0 ||
        tuple_of(ports, "landlock ports", -1) < 0)
        return -1;
    s->n_ll_ready = (size_t)PyTuple_GET_SIZE(ready);
    s->n_ll_paths = (size_t)PyTuple_GET_SIZE(paths);
    s->n_ll_ports = (size_t)PyTuple_GET_SIZE(ports);
    s->ll_ready = spec_alloc(s, s->n_ll_ready, sizeof *s->ll_ready);
    s->ll_paths = spec_alloc(s, s->n_ll_paths, sizeof *s->ll_paths);
    s->ll_dir_rights = spec_alloc(s, s->n_ll_paths, sizeof *s->ll_dir_rights);
    s->ll_file_rights = spec_alloc(s, s->n_ll_paths, sizeof *s->ll_file_rights);
    s->ll_ports = spec_alloc(s, s->n_ll_ports, sizeof *s->ll_ports);
    if (!s->ll_ready || !s->ll_paths || !s->ll_dir_rights || !s->ll_file_rights || !s->ll_ports) return -1;
    for (size_t i = 0; i < s->n_ll_ready; i++) {
        PyObject *rule = PyTuple_GET_ITEM(ready, (Py_ssize_t)i);
        if (!PyBytes_Check(rule) || PyBytes_GET_SIZE(rule) != (Py_ssize_t)sizeof(struct cell_path_beneath)) {
            PyErr_SetString(PyExc_ValueError,
                            "each landlock rule must be a packed path_beneath_attr (12 bytes)");
            return -1;
        }
        memcpy(&s->ll_ready[i], PyBytes_AS_STRING(rule), sizeof(struct cell_path_beneath));
    }
    for (size_t i = 0; i < s->n_ll_paths; i++) {
        PyObject *entry = PyTuple_GET_ITEM(paths, (Py_ssize_t)i);
        if (tuple_of(entry, "each landlock path", 3) < 0) return -1;
        s->ll_paths[i] = to_path(s, PyTuple_GET_ITEM(entry, 0), "landlock paths", (Py_ssize_t)i, 1);
        if (s->ll_paths[i] == NULL ||
            to_u64(PyTuple_GET_ITEM(entry, 1), "landlock directory rights", &s->ll_dir_rights[i]) < 0 ||
            to_u64(PyTuple_GET_ITEM(entry, 2), "landlock file rights", &s->ll_file_rights[i]) < 0)
            return -1;
    }
    for (size_t i = 0; i < s->n_ll_ports; i++) {
        PyObject *rule = PyTuple_GET_ITEM(ports, (Py_ssize_t)i);
        if (!PyBytes_Check(rule) || PyBytes_GET_SIZE(rule) != (Py_ssize_t)sizeof(struct cell_net_port)) {
            PyErr_SetString(PyExc_ValueError, "each landlock port must be a net_port_attr (16 bytes)");
            return -1;
        }
        memcpy(&s->ll_ports[i], PyBytes_AS_STRING(rule), sizeof(struct cell_net_port));
    }
    if (to_long(PyTuple_GET_ITEM(ll, 4), 0, UINT_MAX, "landlock restrict flags", &flags) < 0) return -1;
    s->ll_flags = (unsigned int)flags;
    s->landlock = 1;
    return 0;
}

static int parse_filters(struct spec *s, PyObject *filters) {
    if (tuple_of(filters, "seccomp", -1) < 0) return -1;
    s->n_filters = (size_t)PyTuple_GET_SIZE(filters);
    s->filters = spec_alloc(s, s->n_filters, sizeof *s->filters);
    s->filter_flags = spec_alloc(s, s->n_filters, sizeof *s->filter_flags);
    if (s->filters == NULL || s->filter_flags == NULL) return -1;
    for (size_t i = 0; i < s->n_filters; i++) {
        PyObject *entry = PyTuple_GET_ITEM(filters, (Py_ssize_t)i), *program;
        Py_ssize_t size;
        int log;
        void *copy;
        if (tuple_of(entry, "each seccomp filter", 2) < 0) return -1;
        program = PyTuple_GET_ITEM(entry, 0);
        size = PyBytes_Check(program) ? PyBytes_GET_SIZE(program) : -1;
        if (size <= 0 || size % (Py_ssize_t)sizeof(struct sock_filter) ||
            size / (Py_ssize_t)sizeof(struct sock_filter) > BPF_MAXINSNS) {
            PyErr_Format(PyExc_ValueError, "seccomp[%zd] must be bytes of 1 to %d BPF instructions",
                         (Py_ssize_t)i, BPF_MAXINSNS);
            return -1;
        }
        if (to_bool(PyTuple_GET_ITEM(entry, 1), "seccomp.log", (Py_ssize_t)i, &log) < 0) return -1;
        if ((copy = spec_alloc(s, (size_t)size, 1)) == NULL) return -1;
        memcpy(copy, PyBytes_AS_STRING(program), (size_t)size);
        s->filters[i].len = (unsigned short)(size / (Py_ssize_t)sizeof(struct sock_filter));
        s->filters[i].filter = copy;
        /* SECCOMP_FILTER_FLAG_LOG (Linux 4.14): the kernel logs this filter's refusals. */
        s->filter_flags[i] = log ? SECCOMP_FILTER_FLAG_LOG : 0;
    }
    return 0;
}

static int parse_fds(PyObject *obj, const char *what, int *out, Py_ssize_t count) {
    if (tuple_of(obj, what, count) < 0) return -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        long fd;
        if (to_long(PyTuple_GET_ITEM(obj, i), 0, INT_MAX, what, &fd) < 0) return -1;
        out[i] = (int)fd;
    }
    return 0;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

static int parse_spec(struct spec *s, PyObject **a) {
    /* a: argv, env, workdir, mounts, landlock, seccomp, cgroup_procs, loginuid,
     * stdio, status_pipe, go_pipe, cap_last, keep_fds, notify (None or (program, socket)) */
    Py_ssize_t n;
    long value;
    int pipe_fds[2];
    s->search_path = "/bin:/usr/bin"; /* os.defpath, when the env has no PATH */
    if (tuple_of(a[0], "argv", -1) < 0) return -1;
    if ((n = PyTuple_GET_SIZE(a[0])) == 0) {
        PyErr_SetString(PyExc_ValueError, "argv must not be empty");
        return -1;
    }
    if ((s->argv = spec_alloc(s, (size_t)n + 1, sizeof *s->argv)) == NULL) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *bytes = NULL;
        if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(a[0], i), &bytes)) return -1;
        if (PyList_Append(s->owned, bytes) < 0) {
            Py_DECREF(bytes);
            return -1;
        }
        Py_DECREF(bytes);
        if ((s->argv[i] = spec_strdup(s, PyBytes_AS_STRING(bytes), (size_t)PyBytes_GET_SIZE(bytes))) == NULL)
            return -1;
    }
    if (s->argv[0][0] == '\0') {
        PyErr_SetString(PyExc_ValueError, "argv[0] must not be empty");
        return -1;
    }
    if (tuple_of(a[1], "env", -1) < 0) return -1;
    n = PyTuple_GET_SIZE(a[1]);
    if ((s->envp = spec_alloc(s, (size_t)n + 1, sizeof *s->envp)) == NULL) return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *pair = PyTuple_GET_ITEM(a[1], i), *key = NULL, *val = NULL;
        Py_ssize_t klen, vlen;
        char *entry;
        if (tuple_of(pair, "each env entry (name, value)", 2) < 0) return -1;
        if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(pair, 0), &key)) return -1;
        if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(pair, 1), &val)) {
            Py_DECREF(key);
            return -1;
        }
        klen = PyBytes_GET_SIZE(key);
        vlen = PyBytes_GET_SIZE(val);
        if (klen == 0 || memchr(PyBytes_AS_STRING(key), '=', (size_t)klen) != NULL) {
            PyErr_Format(PyExc_ValueError, "illegal environment variable name %R", PyTuple_GET_ITEM(pair, 0));
            entry = NULL;
        } else if ((entry = spec_alloc(s, (size_t)klen + (size_t)vlen + 2, 1)) != NULL) {
            memcpy(entry, PyBytes_AS_STRING(key), (size_t)klen);
            entry[klen] = '=';
            memcpy(entry + klen + 1, PyBytes_AS_STRING(val), (size_t)vlen);
            if (klen == 4 && memcmp(entry, "PATH", 4) == 0) s->search_path = entry + 5;
        }
        Py_DECREF(key);
        Py_DECREF(val);
        if (entry == NULL) return -1;
        s->envp[i] = entry;
    }
    if ((s->workdir = to_path(s, a[2], "workdir", 0, 0)) == NULL) return -1;
    if (tuple_of(a[3], "mounts", -1) < 0) return -1;
    s->n_ops = (size_t)PyTuple_GET_SIZE(a[3]);
    if ((s->ops = spec_alloc(s, s->n_ops, sizeof *s->ops)) == NULL) return -1;
    for (size_t i = 0; i < s->n_ops; i++)
        if (parse_op(s, PyTuple_GET_ITEM(a[3], (Py_ssize_t)i), (Py_ssize_t)i, &s->ops[i]) < 0) return -1;
    if (parse_landlock(s, a[4]) < 0 || parse_filters(s, a[5]) < 0) return -1;
    s->notify_sock = -1;
    if (a[13] != Py_None) {
        /* (program, socket): the user-notification filter and where its listener goes. */
        Py_ssize_t size;
        void *copy;
        if (tuple_of(a[13], "notify", 2) < 0) return -1;
        size = PyBytes_Check(PyTuple_GET_ITEM(a[13], 0)) ? PyBytes_GET_SIZE(PyTuple_GET_ITEM(a[13], 0)) : -1;
        if (size <= 0 || size % (Py_ssize_t)sizeof(struct sock_filter) ||
            size / (Py_ssize_t)sizeof(struct sock_filter) > BPF_MAXINSNS) {
            PyErr_Format(PyExc_ValueError, "notify[0] must be bytes of 1 to %d BPF instructions", BPF_MAXINSNS);
            return -1;
        }
        if (to_long(PyTuple_GET_ITEM(a[13], 1), 3, INT_MAX, "notify[1]", &value) < 0) return -1;
        if ((copy = spec_alloc(s, (size_t)size, 1)) == NULL) return -1;
        memcpy(copy, PyBytes_AS_STRING(PyTuple_GET_ITEM(a[13], 0)), (size_t)size);
        s->notify.len = (unsigned short)(size / (Py_ssize_t)sizeof(struct sock_filter));
        s->notify.filter = copy;
        s->notify_sock = (int)value;
    }
    s->cell_uid = s->cell_gid = CELL_UID;
    if (a[16] != Py_None) {
        /* identity: (uid, gid, kept capabilities) of the command inside. */
        long caps_lo;
        if (tuple_of(a[16], "identity", 3) < 0 ||
            to_long(PyTuple_GET_ITEM(a[16], 0), 0, 65534, "identity uid", &s->cell_uid) < 0 ||
            to_long(PyTuple_GET_ITEM(a[16], 1), 0, 65534, "identity gid", &s->cell_gid) < 0 ||
            to_long(PyTuple_GET_ITEM(a[16], 2), 0, (long)UINT32_MAX, "identity capabilities", &caps_lo) < 0)
            return -1;
        s->keep_caps = (uint64_t)caps_lo;
    }
    s->session_fd = -1;
    if (a[15] != Py_None) {
        /* session: a descriptor that must also be one of keep_fds (checked below). */
        if (to_long(a[15], 3, INT_MAX, "session", &value) < 0) return -1;
        s->session_fd = (int)value;
    }
    s->owner_uid = s->owner_gid = -1;
    if (a[14] != Py_None) {
        /* (uid, gid) of the user namespace's creator: never root (0), never "unset" (-1). */
        if (tuple_of(a[14], "userns_owner", 2) < 0 ||
            to_long(PyTuple_GET_ITEM(a[14], 0), 1, (long)UINT32_MAX - 1, "userns_owner uid", &s->owner_uid) < 0 ||
            to_long(PyTuple_GET_ITEM(a[14], 1), 1, (long)UINT32_MAX - 1, "userns_owner gid", &s->owner_gid) < 0)
            return -1;
    }
    if (tuple_of(a[6], "cgroup_procs", -1) < 0) return -1;
    s->n_cgroups = (size_t)PyTuple_GET_SIZE(a[6]);
    if ((s->cgroups = spec_alloc(s, s->n_cgroups, sizeof *s->cgroups)) == NULL) return -1;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)s->n_cgroups; i++)
        if ((s->cgroups[i] = to_path(s, PyTuple_GET_ITEM(a[6], i), "cgroup_procs", i, 1)) == NULL) return -1;
    if (a[7] != Py_None) {
        /* audit_loginuid: a uid; (uid_t)-1 is "unset" and cannot be written. */
        if (to_long(a[7], 0, (long)UINT32_MAX - 1, "loginuid", &value) < 0) return -1;
        digits_of(s->loginuid, (unsigned long)value);
    }
    if (parse_fds(a[8], "stdio", s->stdio, 3) < 0) return -1;
    if (parse_fds(a[9], "status_pipe", pipe_fds, 2) < 0) return -1;
    s->status_r = pipe_fds[0];
    s->status_w = pipe_fds[1];
    if (parse_fds(a[10], "go_pipe", pipe_fds, 2) < 0) return -1;
    s->go_r = pipe_fds[0];
    s->go_w = pipe_fds[1];
    /* capset(2) version 3 holds 64 capabilities. */
    if (to_long(a[11], 0, 63, "cap_last", &value) < 0) return -1;
    s->cap_last = (int)value;
    if (tuple_of(a[12], "keep_fds", -1) < 0) return -1;
    s->n_keep = (size_t)PyTuple_GET_SIZE(a[12]);
    if ((s->keep = spec_alloc(s, s->n_keep, sizeof *s->keep)) == NULL) return -1;
    for (size_t i = 0; i < s->n_keep; i++) {
        if (to_long(PyTuple_GET_ITEM(a[12], (Py_ssize_t)i), 3, INT_MAX, "keep_fds", &value) < 0) return -1;
        s->keep[i] = (int)value;
    }
    qsort(s->keep, s->n_keep, sizeof *s->keep, cmp_int);
    if (s->session_fd >= 0 && bsearch(&s->session_fd, s->keep, s->n_keep, sizeof *s->keep, cmp_int) == NULL) {
        PyErr_SetString(PyExc_ValueError, "the session descriptor must be one of keep_fds");
        return -1;
    }
    s->decoy_uid = s->decoy_gid = -1;
    if (a[17] != Py_None) {
        /* decoys: (uid, gid, writable): the host ids that own the cell's
         * decoys, and the paths it may write beneath (decoy_template). */
        PyObject *paths;
        if (tuple_of(a[17], "decoys", 3) < 0 ||
            to_long(PyTuple_GET_ITEM(a[17], 0), 0, (long)UINT32_MAX - 1, "decoys uid", &s->decoy_uid) < 0 ||
            to_long(PyTuple_GET_ITEM(a[17], 1), 0, (long)UINT32_MAX - 1, "decoys gid", &s->decoy_gid) < 0 ||
            tuple_of(paths = PyTuple_GET_ITEM(a[17], 2), "decoys writable", -1) < 0)
            return -1;
        s->n_writable = (size_t)PyTuple_GET_SIZE(paths);
        if ((s->writable = spec_alloc(s, s->n_writable, sizeof *s->writable)) == NULL) return -1;
        for (size_t i = 0; i < s->n_writable; i++)
            if ((s->writable[i] = to_path(s, PyTuple_GET_ITEM(paths, (Py_ssize_t)i), "decoys writable",
                                          (Py_ssize_t)i, 1)) == NULL)
                return -1;
    }
    /* What C1 keeps: its pipe ends, stdio sources, the user namespaces of
     * idmapped grants, the descriptors of ready Landlock rules, keep_fds
     * (and the decoys' templates, decoy_template). */
    s->c1_keep = spec_alloc(s, 6 + 2 * s->n_ops + s->n_ll_ready + s->n_ll_paths + s->n_keep, sizeof *s->c1_keep);
    if (s->c1_keep == NULL) return -1;
    s->c1_keep[s->n_c1_keep++] = s->status_w;
    s->c1_keep[s->n_c1_keep++] = s->go_r;
    for (int i = 0; i < 3; i++) s->c1_keep[s->n_c1_keep++] = s->stdio[i];
    for (size_t i = 0; i < s->n_ops; i++)
        if (s->ops[i].userns_fd >= 0) s->c1_keep[s->n_c1_keep++] = s->ops[i].userns_fd;
    for (size_t i = 0; i < s->n_ll_ready; i++) s->c1_keep[s->n_c1_keep++] = s->ll_ready[i].parent_fd;
    for (size_t i = 0; i < s->n_keep; i++) s->c1_keep[s->n_c1_keep++] = s->keep[i];
    if (s->notify_sock >= 0) s->c1_keep[s->n_c1_keep++] = s->notify_sock;
    qsort(s->c1_keep, s->n_c1_keep, sizeof *s->c1_keep, cmp_int);
    return 0;
}

/* ------------------------------------------ parent side: the decoy template */

/* A default cell's decoy directories hold about 500 names (the host's /root,
 * /run, /var/lib/stockade, sysfs's block directories, ...), and making them,
 * one mkdirat or mknodat each on a fresh tmpfs, was the largest single cost
 * of a start (2.6 of 16 ms of CPU, issue 18). They are the same from one cell
 * to the next of a process: so each is made once, as a detached tmpfs of its
 * own (a template, never attached anywhere on the host) owned by the cell's
 * host ids as the cell's own would be, and each cell shows a copy of it
 * (open_tree(OPEN_TREE_CLONE) in C1, move_mount in the init): two syscalls a
 * decoy directory instead of one a name.
 *
 * A copy shares the template's files, so a template is used only where no
 * cell can write: a decoy directory that no Landlock write grant covers (nor
 * a tmpfs, /dev, /proc or a workbench's overlay), Landlock granting nothing
 * beneath a decoy, so every attempt is refused and recorded as before; and
 * only where nothing else of the view is made beneath it but mount points
 * the template holds already. A template's tmpfs has inodes for little more
 * than that. A template is made at the second launch that asks for the same
 * one (a process that starts one cell, `stockade exec`, makes its decoys as
 * before); the last TMPL_KEPT are kept, each for as long as launches ask for
 * it (a decoy of a busy place, /var/lib/stockade, changes often; sysfs's
 * never). */

#define TMPL_NESTED_DIR 1
#define TMPL_NESTED_FILE 2
#define TMPL_KEPT 64

struct tmpl {
    char *key; /* what the template holds, serialised: compared whole, never hashed */
    size_t len;
    int fd;     /* its mount (fsmount), or -1: not made (yet) */
    int failed; /* making it failed: this key's cells make this decoy themselves */
    unsigned long used; /* the launch that last asked for it (the least recent goes first) */
};
static struct tmpl decoy_cache[TMPL_KEPT]; /* a slot is empty while its key is NULL */
static unsigned long decoy_launches;

/* path is top or beneath it. */
static int at_or_under(const char *path, const char *top) {
    size_t n = strlen(top);
    if (n == 1 && top[0] == '/') return 1;
    return strncmp(path, top, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

static int strictly_under(const char *path, const char *top) {
    return at_or_under(path, top) && strcmp(path, top) != 0;
}

/* What a later op beneath a template decoy needs made in the template, so
 * that the init makes nothing there: TMPL_NESTED_DIR/FILE, 0 for nothing (it
 * is not beneath), -1 where the decoy cannot be a template. */
static int nested_need(const struct spec *s, size_t i, size_t k);

static int tmpl_eligible(const struct spec *s, size_t i) {
    const struct op *op = &s->ops[i];
    if (op->kind != K_DECOY_DIR || s->decoy_uid < 0 || (s->n_ops && s->ops[0].kind == K_OVERLAY)) return 0;
    for (size_t w = 0; w < s->n_writable; w++)
        if (at_or_under(op->dst, s->writable[w])) return 0;
    for (size_t k = 0; k < s->n_ops; k++) {
        const struct op *other = &s->ops[k];
        int kind = other->kind;
        if ((kind == K_TMPFS || kind == K_OVERLAY || kind == K_DEV || kind == K_PROC) &&
            at_or_under(op->dst, other->dst))
            return 0;
        /* Without a mount of its own today, a decoy in the cell's root shows
         * what earlier ops made beneath it; a copy would cover it. */
        if (k < i && !op->writable && at_or_under(other->dst, op->dst)) return 0;
        if (k > i && nested_need(s, i, k) < 0) return 0;
    }
    return 1;
}

static int nested_need(const struct spec *s, size_t i, size_t k) {
    const struct op *other = &s->ops[k];
    struct stat st;
    if (!strictly_under(other->dst, s->ops[i].dst)) return 0;
    switch (other->kind) {
    case K_DECOY_DIR:
        /* A writable one is a tmpfs of its own; one in the root must be a
         * template too, or its names would be made in this one. */
        return other->writable || tmpl_eligible(s, k) ? TMPL_NESTED_DIR : -1;
    case K_TMPFS:
    case K_DIR:
        return TMPL_NESTED_DIR;
    case K_DECOY_FILE:
    case K_FILE:
        return TMPL_NESTED_FILE;
    case K_BIND:
        if (other->from_view) return -1;
        if (stat(other->src, &st) < 0) return 0; /* gone: C1 leaves it out */
        return S_ISDIR(st.st_mode) ? TMPL_NESTED_DIR : TMPL_NESTED_FILE;
    default:
        return -1;
    }
}

struct buf {
    char *data;
    size_t len, cap;
    int failed;
};

static void buf_put(struct buf *b, const void *data, size_t len) {
    if (b->failed) return;
    if (b->len + len > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        char *grown;
        while (cap < b->len + len) cap *= 2;
        if ((grown = PyMem_Realloc(b->data, cap)) == NULL) {
            b->failed = 1;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
}

static void buf_str(struct buf *b, const char *text) { buf_put(b, text, strlen(text) + 1); }

/* mkdir -p of rel beneath dir, its last component a directory or a file. */
static int make_nested(int dir, const char *rel, int need) {
    char path[PATH_MAX];
    size_t len = strlen(rel);
    if (len == 0 || len >= sizeof path) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(path, rel, len + 1);
    for (size_t c = 1; c < len; c++) {
        if (path[c] != '/') continue;
        path[c] = '\0';
        if (mkdirat(dir, path, 0755) < 0 && errno != EEXIST) return -1;
        path[c] = '/';
    }
    if ((need == TMPL_NESTED_DIR ? mkdirat(dir, path, 0755) : mknodat(dir, path, S_IFREG | 0644, 0)) < 0 &&
        errno != EEXIST)
        return -1;
    return 0;
}

struct tmpl_job {
    const struct spec *s;
    const int *fill; /* per op: the mount fd of a new template to fill, or -1 */
    int err;
};

/* The templates' maker: a CLONE_VM | CLONE_VFORK child (the caller's thread
 * waits), so that its umask and file system ids are its own, never the
 * caller's process's; only syscalls, into memory the caller does not touch
 * meanwhile. Made as the cell's host ids, the names are the cell's own. */
static int tmpl_child(void *arg) {
    struct tmpl_job *j = arg;
    const struct spec *s = j->s;
    (void)syscall(SYS_umask, 022);
    (void)syscall(SYS_setfsgid, s->decoy_gid);
    (void)syscall(SYS_setfsuid, s->decoy_uid);
    if (syscall(SYS_setfsuid, -1) != s->decoy_uid || syscall(SYS_setfsgid, -1) != s->decoy_gid) {
        j->err = EPERM;
        syscall(SYS_exit, 0);
    }
    for (size_t i = 0; i < s->n_ops; i++) {
        const struct op *op = &s->ops[i];
        int dir = j->fill[i];
        size_t top = strcmp(op->dst, "/") == 0 ? 0 : strlen(op->dst);
        if (dir < 0) continue;
        for (size_t n = 0; n < op->n_names; n++) {
            int made = op->name_is_dir[n] ? mkdirat(dir, op->names[n], 0755)
                                          : mknodat(dir, op->names[n], S_IFREG | 0644, 0);
            if (made < 0 && errno != EEXIST) goto fail;
        }
        for (size_t k = i + 1; k < s->n_ops; k++) {
            int need = nested_need(s, i, k);
            if (need > 0 && make_nested(dir, s->ops[k].dst + top + 1, need) < 0) goto fail;
        }
    }
    syscall(SYS_exit, 0);
    return 0;
fail:
    j->err = errno ? errno : EIO;
    syscall(SYS_exit, 0);
    return 0;
}

static int fs_set(int fs, const char *key, const char *value) {
    return (int)syscall(SYS_fsconfig, fs, 1 /* FSCONFIG_SET_STRING */, key, value, 0);
}

/* A fresh, empty template for one decoy: a detached tmpfs whose root is the
 * decoy directory (mode 0755, the cell's host ids); its mount fd, or -1. */
static int tmpl_mount(const struct spec *s, size_t inodes) {
    char digits[24];
    int fs, mnt = -1;
    fs = (int)syscall(SYS_fsopen, "tmpfs", 1u /* FSOPEN_CLOEXEC */);
    if (fs < 0) return -1;
    if (fs_set(fs, "mode", "0755") == 0 && fs_set(fs, "uid", digits_of(digits, (unsigned long)s->decoy_uid)) == 0 &&
        fs_set(fs, "gid", digits_of(digits, (unsigned long)s->decoy_gid)) == 0 &&
        fs_set(fs, "nr_inodes", digits_of(digits, inodes)) == 0 && fs_set(fs, "size", "64k") == 0 &&
        syscall(SYS_fsconfig, fs, 6 /* FSCONFIG_CMD_CREATE */, NULL, NULL, 0) == 0)
        mnt = (int)syscall(SYS_fsmount, fs, 1u /* FSMOUNT_CLOEXEC */,
                           CELL_MOUNT_ATTR_NOSUID | CELL_MOUNT_ATTR_NODEV | CELL_MOUNT_ATTR_NOEXEC);
    close(fs);
    return mnt;
}

/* Fill the new templates (fill[i] >= 0) in one child; 0, or -1. */
static int tmpl_fill(const struct spec *s, const int *fill) {
    struct tmpl_job job = {.s = s, .fill = fill, .err = 0};
    sigset_t all, old;
    int status;
    char *stack;
    pid_t pid;
    stack = mmap(NULL, INIT_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) return -1;
    /* No handler of the caller's may run in the templates' maker. */
    sigfillset(&all);
    if (pthread_sigmask(SIG_SETMASK, &all, &old) != 0) {
        munmap(stack, INIT_STACK);
        return -1;
    }
    pid = clone(tmpl_child, stack + INIT_STACK, CLONE_VM | CLONE_VFORK | SIGCHLD, &job);
    if (pid > 0)
        while (waitpid(pid, &status, __WALL) < 0 && errno == EINTR) {
        }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    munmap(stack, INIT_STACK);
    return pid < 0 || job.err ? -1 : 0;
}

/* The serialised content of op i's template into key (reset first); the
 * number of inodes it needs. */
static size_t tmpl_key(const struct spec *s, size_t i, struct buf *key) {
    const struct op *op = &s->ops[i];
    long ids[2] = {s->decoy_uid, s->decoy_gid};
    size_t inodes = op->n_names + 16;
    key->len = 0;
    buf_put(key, ids, sizeof ids);
    buf_str(key, op->dst);
    buf_put(key, &op->n_names, sizeof op->n_names);
    for (size_t n = 0; n < op->n_names; n++) {
        buf_put(key, &op->name_is_dir[n], 1);
        buf_str(key, op->names[n]);
    }
    for (size_t k = i + 1; k < s->n_ops; k++) {
        int need = nested_need(s, i, k);
        if (need <= 0) continue;
        buf_put(key, &need, sizeof need);
        buf_str(key, s->ops[k].dst);
        inodes += 16; /* the mount point and the directories leading to it */
    }
    return inodes;
}

/* Which decoys of this spec are copies of a template (op->tmpl_fd), making
 * those asked for a second time. Never fails: where no template can be had,
 * the init makes the decoy as it always did. */
static void decoy_template(struct spec *s) {
    struct buf key = {NULL, 0, 0, 0};
    int *fill;
    struct tmpl **entry;
    size_t n_fill = 0;
    if (s->decoy_uid < 0 || s->n_ops == 0) return;
    fill = PyMem_Malloc(s->n_ops * sizeof *fill);
    entry = PyMem_Calloc(s->n_ops, sizeof *entry);
    if (fill == NULL || entry == NULL) goto done;
    decoy_launches++;
    for (size_t i = 0; i < s->n_ops; i++) {
        struct tmpl *t = NULL, *oldest = &decoy_cache[0];
        size_t inodes;
        fill[i] = -1;
        if (!tmpl_eligible(s, i)) continue;
        inodes = tmpl_key(s, i, &key);
        if (key.failed) goto done;
        for (size_t c = 0; c < TMPL_KEPT && t == NULL; c++) {
            struct tmpl *e = &decoy_cache[c];
            if (e->key != NULL && e->len == key.len && memcmp(e->key, key.data, key.len) == 0) t = e;
            if (e->used < oldest->used) oldest = e;
        }
        if (t == NULL) {
            /* First asked for: remembered, not made (unless every kept one
             * is this launch's: more template decoys than TMPL_KEPT). */
            char *copy;
            if (oldest->used == decoy_launches) continue;
            if ((copy = PyMem_Malloc(key.len)) == NULL) goto done;
            memcpy(copy, key.data, key.len);
            PyMem_Free(oldest->key);
            /* (An empty slot has no key and a zero fd, not its own.) The
             * cells that show the old template hold copies of their own. */
            if (oldest->key != NULL && oldest->fd >= 0) close(oldest->fd);
            oldest->key = copy;
            oldest->len = key.len;
            oldest->fd = -1;
            oldest->failed = 0;
            oldest->used = decoy_launches;
            continue;
        }
        t->used = decoy_launches;
        if (t->fd < 0 && !t->failed) {
            t->fd = tmpl_mount(s, inodes);
            t->failed = t->fd < 0;
            fill[i] = t->fd;
            n_fill++;
        }
        entry[i] = t;
    }
    if (n_fill && tmpl_fill(s, fill) < 0) {
        /* None of the new ones is used: each may be half made. */
        for (size_t i = 0; i < s->n_ops; i++) {
            if (fill[i] < 0) continue;
            close(entry[i]->fd);
            entry[i]->fd = -1;
            entry[i]->failed = 1;
        }
    }
    /* A decoy in the cell's root beneath a template's copy that is not a copy
     * itself (its names changed since: a workspace was made, so this launch
     * only remembers its new key) would make its names in that copy, which
     * has room for the template's own only (ENOSPC). The copy is not used
     * then: that decoy is made as it always was. Deepest first, so that the
     * one given up counts for those above it. */
    for (size_t i = s->n_ops; i-- > 0;) {
        if (entry[i] == NULL || entry[i]->fd < 0) continue;
        for (size_t k = i + 1; k < s->n_ops; k++) {
            const struct op *other = &s->ops[k];
            if (other->kind == K_DECOY_DIR && !other->writable && strictly_under(other->dst, s->ops[i].dst) &&
                (entry[k] == NULL || entry[k]->fd < 0)) {
                entry[i] = NULL;
                break;
            }
        }
    }
    for (size_t i = 0; i < s->n_ops; i++) {
        if (entry[i] == NULL || entry[i]->fd < 0) continue;
        s->ops[i].tmpl_fd = entry[i]->fd;
        s->c1_keep[s->n_c1_keep++] = entry[i]->fd;
    }
    qsort(s->c1_keep, s->n_c1_keep, sizeof *s->c1_keep, cmp_int);
done:
    PyMem_Free(key.data);
    PyMem_Free(fill);
    PyMem_Free(entry);
}

/* --------------------------------- parent side: Landlock's host entries, kept */

/* The entries of a granted directory that holds a hidden path (/etc's, about
 * 150 at a default start) are granted one by one, and the init opened each
 * through the view, added its rule and let go: about 1 ms of every start
 * (issue 18). Those the view shows through a bind of the host (the host's own
 * inodes, as the init would find them) are opened here instead, once a
 * process, and kept: HELD_MAX of them at most (and a quarter of
 * RLIMIT_NOFILE), never the entries of a directory that has more than
 * HELD_DIR_MAX, never beneath a path the cell may write (a grant can hold any
 * number of entries: one descriptor each kept made a daemon die with EMFILE
 * once), looked up without a symbolic link
 * or a mount crossed beneath the bind's source (the bind shows neither as
 * the host path would), and checked again against the host path (device and
 * inode) once they are HELD_FRESH_NS old, as _layers.HostDescriptors does:
 * a file replaced since is refused until then, never another granted. */

#define HELD_SLOTS 1024
#define HELD_MAX 512
#define HELD_DIR_MAX 256
#define HELD_FRESH_NS 2000000000LL

struct held {
    char *path; /* the host path; NULL: an empty slot */
    int fd, is_dir;
    dev_t dev;
    ino_t ino;
    long long checked; /* CLOCK_MONOTONIC, ns */
};
static struct held held_cache[HELD_SLOTS];
static size_t n_held, held_max = HELD_MAX;

static uint64_t fnv(const char *text) {
    uint64_t h = 1469598103934665603ull;
    for (; *text; text++) h = (h ^ (unsigned char)*text) * 1099511628211ull;
    return h;
}

static long long monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

/* struct open_how and RESOLVE_* of <linux/openat2.h> (Linux 5.6). */
struct cell_open_how {
    uint64_t flags, mode, resolve;
};
#define CELL_RESOLVE_NO_XDEV 0x01
#define CELL_RESOLVE_NO_SYMLINKS 0x04
#define CELL_RESOLVE_BENEATH 0x08
#ifndef SYS_openat2
#define SYS_openat2 437
#endif

/* A kept descriptor of src/rel (rel beneath the bind's source src), opened
 * now or earlier; NULL where there is none to have. */
static struct held *held_open(const char *src, const char *rel, long long now) {
    char host[PATH_MAX];
    struct held *slot = NULL;
    struct stat st;
    struct cell_open_how how = {.flags = O_PATH | O_CLOEXEC | O_NOFOLLOW,
                                .resolve = CELL_RESOLVE_NO_XDEV | CELL_RESOLVE_NO_SYMLINKS | CELL_RESOLVE_BENEATH};
    int dir, fd;
    if (join(host, sizeof host, src, "/", rel) < 0) return NULL;
    for (uint64_t h = fnv(host), n = 0; n < HELD_SLOTS; n++) {
        struct held *e = &held_cache[(h + n) % HELD_SLOTS];
        if (e->path == NULL || strcmp(e->path, host) == 0) {
            slot = e;
            break;
        }
    }
    if (slot == NULL) return NULL;
    if (slot->path != NULL) {
        if (now - slot->checked < HELD_FRESH_NS) return slot;
        if (lstat(host, &st) == 0 && st.st_dev == slot->dev && st.st_ino == slot->ino) {
            slot->checked = now;
            return slot;
        }
        /* Replaced or gone: this slot opens it afresh (the cells launched
         * with the old descriptor hold copies of their own). */
        close(slot->fd);
        PyMem_Free(slot->path);
        slot->path = NULL;
        n_held--;
    }
    if (n_held >= held_max) return NULL;
    if ((dir = open(src, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) return NULL;
    fd = (int)syscall(SYS_openat2, dir, rel, &how, sizeof how);
    close(dir);
    if (fd < 0) return NULL; /* gone, a link, or across a mount: the init looks for itself */
    if (fstat(fd, &st) < 0 || S_ISLNK(st.st_mode) || (slot->path = PyMem_Malloc(strlen(host) + 1)) == NULL) {
        close(fd);
        return NULL;
    }
    memcpy(slot->path, host, strlen(host) + 1);
    slot->fd = fd;
    slot->is_dir = S_ISDIR(st.st_mode);
    slot->dev = st.st_dev;
    slot->ino = st.st_ino;
    slot->checked = now;
    n_held++;
    return slot;
}

/* For each Landlock path the view shows through a bind of the host, where
 * the cell may not write: a kept descriptor (s->ll_held[i]), its rule added
 * by the init without a lookup. Never fails: the init opens the rest. */
static void hold_entries(struct spec *s) {
    long long now;
    int crowded = 0;
    if (s->decoy_uid < 0 || s->n_ll_paths == 0 || (s->n_ops && s->ops[0].kind == K_OVERLAY)) return;
    if ((s->ll_held = spec_alloc(s, s->n_ll_paths, sizeof *s->ll_held)) == NULL ||
        (s->ll_held_dir = spec_alloc(s, s->n_ll_paths, 1)) == NULL) {
        PyErr_Clear();
        s->ll_held = NULL;
        return;
    }
    now = monotonic_ns();
    if (n_held == 0) {
        struct rlimit files;
        held_max = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur / 4 < HELD_MAX ? files.rlim_cur / 4
                                                                                             : HELD_MAX;
    }
    for (size_t i = 0, run = 0; i < s->n_ll_paths; i++) {
        const char *path = s->ll_paths[i], *slash = strrchr(path, '/');
        const struct op *cover = NULL;
        struct held *kept;
        int writable = 0;
        s->ll_held[i] = -1;
        /* run: how many paths from i on share its directory (they come in
         * order); a crowded directory's entries are left to the init. */
        if (run == 0) {
            size_t dir_len = slash ? (size_t)(slash - path) : 0;
            run = 1;
            while (i + run < s->n_ll_paths && strncmp(s->ll_paths[i + run], path, dir_len + 1) == 0 &&
                   strchr(s->ll_paths[i + run] + dir_len + 1, '/') == NULL)
                run++;
            crowded = run > HELD_DIR_MAX;
        }
        run--;
        if (crowded) continue;
        for (size_t k = s->n_ops; k-- > 0 && cover == NULL;)
            if (s->ops[k].kind != K_SYMLINK && at_or_under(path, s->ops[k].dst)) cover = &s->ops[k];
        if (cover == NULL || cover->kind != K_BIND || cover->from_view || strcmp(path, cover->dst) == 0) continue;
        for (size_t w = 0; w < s->n_writable && !writable; w++) writable = at_or_under(path, s->writable[w]);
        if (writable) continue;
        kept = held_open(cover->src, path + (strcmp(cover->dst, "/") == 0 ? 1 : strlen(cover->dst) + 1), now);
        if (kept == NULL) continue;
        s->ll_held[i] = kept->fd;
        s->ll_held_dir[i] = (unsigned char)kept->is_dir;
        s->c1_keep[s->n_c1_keep++] = kept->fd;
    }
    qsort(s->c1_keep, s->n_c1_keep, sizeof *s->c1_keep, cmp_int);
}

static const char *const SPAWN_KEYWORDS[] = {
    "argv", "env", "workdir", "mounts", "landlock", "seccomp", "cgroup_procs", "loginuid",
    "stdio", "status_pipe", "go_pipe", "cap_last", "keep_fds", "notify", "userns_owner", "session",
    "identity", "decoys", NULL};

static PyObject *spawn(PyObject *module, PyObject *args, PyObject *kwargs) {
    PyObject *a[18] = {NULL};
    struct spec s;
    struct lean lean;
    sigset_t all, old;
    pid_t pid;
    int err;
    (void)module;
    /* All keyword-only; the format can only make them optional ("|$"), so
     * their presence is checked below. */
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OOOOOOOOOOOOOOOOOO:spawn", (char **)SPAWN_KEYWORDS, &a[0],
                                     &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7], &a[8], &a[9], &a[10],
                                     &a[11], &a[12], &a[13], &a[14], &a[15], &a[16], &a[17]))
        return NULL;
    if (a[13] == NULL) a[13] = Py_None; /* notify is optional */
    if (a[14] == NULL) a[14] = Py_None; /* userns_owner is optional */
    if (a[15] == NULL) a[15] = Py_None; /* session is optional */
    if (a[16] == NULL) a[16] = Py_None; /* identity is optional: the agent, uid 1000 */
    if (a[17] == NULL) a[17] = Py_None; /* decoys is optional: no template */
    for (int i = 0; i < 13; i++)
        if (a[i] == NULL)
            return PyErr_Format(PyExc_TypeError, "spawn() missing required keyword argument '%s'",
                                SPAWN_KEYWORDS[i]);
    memset(&s, 0, sizeof s);
    if ((s.owned = PyList_New(0)) == NULL) return NULL;
    if (parse_spec(&s, a) < 0) {
        spec_free(&s);
        return NULL;
    }
    decoy_template(&s);
    hold_entries(&s);
    s.parent = getpid();
    /* No signal handler may run in the child before it resets them. */
    sigfillset(&all);
    if ((err = pthread_sigmask(SIG_SETMASK, &all, &old)) != 0) {
        spec_free(&s);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    lean_begin(&lean, &s);
    pid = cell_fork();
    if (pid == 0) first_child(&s, &old);
    err = errno;
    lean_end(&lean);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    spec_free(&s);
    if (pid < 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong((long)pid);
}

/* ------------------------------------------ user namespaces for idmapped mounts */

static int userns_holder(void *arg) {
    /* Shares the caller's memory (CLONE_VM) and touches none of it: it was
     * born in its new user namespace, waits for the caller to be done with
     * it and exits. Only raw syscalls, no errno kept. */
    const int *fds = arg;
    char c;
    /* Its own copy of the write end would hold back the EOF it waits for. */
    (void)syscall(SYS_close, fds[1]);
    (void)syscall(SYS_read, fds[0], &c, 1);
    syscall(SYS_exit, 0);
    return 0;
}

static int write_proc(pid_t pid, const char *name, const char *data, size_t len) {
    char path[64], digits[24];
    int fd;
    if (join(path, sizeof path, "/proc/", digits_of(digits, (unsigned long)pid), "/") < 0 ||
        join(path + strlen(path), sizeof path - strlen(path), name, NULL, NULL) < 0)
        return -1;
    if ((fd = open(path, O_WRONLY | O_CLOEXEC)) < 0) return -1;
    if (write_all(fd, data, len) < 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return close(fd);
}

/* userns(uid_map, gid_map) -> fd: a fresh user namespace with these maps,
 * for mount_setattr(MOUNT_ATTR_IDMAP), without forking the caller: a
 * CLONE_VM child is born in it (no copy of a large process's page tables;
 * a workbench makes two per run, since its slot's ids change every run). */
static PyObject *userns(PyObject *module, PyObject *args) {
    const char *uid_map, *gid_map;
    Py_ssize_t uid_len, gid_len;
    int pipe_fds[2], held[2], err = 0, ns = -1, status;
    char *stack;
    char path[64], digits[24];
    pid_t pid;
    (void)module;
    if (!PyArg_ParseTuple(args, "y#y#:userns", &uid_map, &uid_len, &gid_map, &gid_len)) return NULL;
    if (pipe2(pipe_fds, O_CLOEXEC) < 0) return PyErr_SetFromErrno(PyExc_OSError);
    stack = mmap(NULL, 64 * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED) {
        err = errno;
        close(pipe_fds[0]);
        close(pipe_fds[1]);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_BEGIN_ALLOW_THREADS
    /* The child reads its own copy: the caller changes pipe_fds below, and
     * the two share memory. */
    held[0] = pipe_fds[0];
    held[1] = pipe_fds[1];
    pid = clone(userns_holder, stack + 64 * 1024, CLONE_NEWUSER | CLONE_VM | SIGCHLD, held);
    if (pid < 0) {
        err = errno;
    } else {
        if (write_proc(pid, "uid_map", uid_map, (size_t)uid_len) < 0 ||
            write_proc(pid, "setgroups", "deny", 4) < 0 ||
            write_proc(pid, "gid_map", gid_map, (size_t)gid_len) < 0 ||
            join(path, sizeof path, "/proc/", digits_of(digits, (unsigned long)pid), "/ns/user") < 0 ||
            (ns = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            err = errno;
        close(pipe_fds[1]); /* EOF: the holder exits */
        pipe_fds[1] = -1;
        while (waitpid(pid, &status, __WALL) < 0 && errno == EINTR) {
        }
    }
    Py_END_ALLOW_THREADS
    close(pipe_fds[0]);
    if (pipe_fds[1] >= 0) close(pipe_fds[1]);
    munmap(stack, 64 * 1024);
    if (ns < 0) {
        errno = err ? err : EIO;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromLong(ns);
}

/* --------------------------------- parent side: the cgroup move's wait, paid ahead */

/* warm_cgroup(tasks, seconds): a thread of this process writes its own thread
 * id to ``tasks`` (the v1 tasks file of the cgroup it is in: a move of
 * nothing) every 4 ms until ``seconds`` from now (_migration.py says why). A
 * thread of C, not of Python: it never takes the GIL, so the launch it runs
 * beside never waits for it. State is atomics, no lock: a fork of this
 * process (C1, or a Python child) inherits no lock held by this thread. */

static _Atomic long long warm_until_ns;
static atomic_int warm_running;
static pid_t warm_pid;
static char warm_path[PATH_MAX];

static long long now_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000LL + now.tv_nsec;
}

static void *warm_loop(void *unused) {
    char tid[24];
    int fd, len;
    (void)unused;
    (void)prctl(PR_SET_NAME, "stockade-cgwarm"); /* its name in /proc/PID/task/TID/comm */
    len = snprintf(tid, sizeof tid, "%ld", (long)syscall(SYS_gettid));
    fd = open(warm_path, O_WRONLY | O_CLOEXEC);
    for (;;) {
        if (fd < 0 || now_ns() >= atomic_load(&warm_until_ns)) {
            atomic_store(&warm_running, 0);
            /* Asked again between the check and the store: go on, unless
             * another ask started a thread of its own meanwhile. */
            if (fd >= 0 && now_ns() < atomic_load(&warm_until_ns) &&
                atomic_compare_exchange_strong(&warm_running, &(int){0}, 1))
                continue;
            break;
        }
        if (write(fd, tid, (size_t)len) < 0) {
            close(fd);
            fd = -1;
            continue;
        }
        nanosleep(&(struct timespec){0, 4000000}, NULL);
    }
    if (fd >= 0) close(fd);
    return NULL;
}

static PyObject *warm_cgroup(PyObject *module, PyObject *args) {
    const char *path;
    double seconds;
    long long until;
    pthread_attr_t attr;
    pthread_t thread;
    sigset_t all, old;
    int err;
    (void)module;
    if (!PyArg_ParseTuple(args, "sd", &path, &seconds)) return NULL;
    if (strlen(path) >= sizeof warm_path || seconds < 0 || seconds > 10) {
        PyErr_SetString(PyExc_ValueError, "warm_cgroup: a tasks path shorter than PATH_MAX, 0-10 seconds");
        return NULL;
    }
    if (warm_pid != getpid()) {
        /* A new process (or a fork's child, whose thread did not come along). */
        warm_pid = getpid();
        atomic_store(&warm_running, 0);
    }
    until = now_ns() + (long long)(seconds * 1e9);
    if (until > atomic_load(&warm_until_ns)) atomic_store(&warm_until_ns, until);
    if (atomic_load(&warm_running) || !atomic_compare_exchange_strong(&warm_running, &(int){0}, 1))
        Py_RETURN_NONE;
    memcpy(warm_path, path, strlen(path) + 1); /* only read by a thread this call starts */
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* no signal of the process goes to it */
    err = pthread_create(&thread, &attr, warm_loop, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (err != 0) {
        atomic_store(&warm_running, 0);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* kept() -> the descriptors this module keeps across launches, by design. */
static PyObject *kept(PyObject *module, PyObject *unused) {
    PyObject *out = PyList_New(0), *result;
    (void)module;
    (void)unused;
    if (out == NULL) return NULL;
    for (size_t i = 0; i < TMPL_KEPT; i++) {
        PyObject *fd;
        if (decoy_cache[i].key == NULL || decoy_cache[i].fd < 0) continue;
        if ((fd = PyLong_FromLong(decoy_cache[i].fd)) == NULL || PyList_Append(out, fd) < 0) {
            Py_XDECREF(fd);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(fd);
    }
    for (size_t i = 0; i < HELD_SLOTS; i++) {
        PyObject *fd;
        if (held_cache[i].path == NULL) continue;
        if ((fd = PyLong_FromLong(held_cache[i].fd)) == NULL || PyList_Append(out, fd) < 0) {
            Py_XDECREF(fd);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(fd);
    }
    result = PyList_AsTuple(out);
    Py_DECREF(out);
    return result;
}

PyDoc_STRVAR(kept_doc,
             "kept() -> tuple[int, ...]\n\n"
             "The descriptors spawn() keeps across launches: the decoys' templates and\n"
             "Landlock's host entries (bounded; for tests that count a process's descriptors).");

PyDoc_STRVAR(userns_doc,
             "userns(uid_map: bytes, gid_map: bytes) -> int\n\n"
             "The fd of a fresh user namespace with these maps (setgroups denied), for\n"
             "idmapped mounts; made by a CLONE_VM child, not a fork of the caller.");

PyDoc_STRVAR(spawn_doc,
             "spawn(*, argv, env, workdir, mounts, landlock, seccomp, cgroup_procs, loginuid, stdio,\n"
             "      status_pipe, go_pipe, cap_last, keep_fds, notify=None, userns_owner=None,\n"
             "      session=None, identity=None, decoys=None) -> int\n\n"
             "Fork the cell's first child (C1) and return its pid. Everything is checked and\n"
             "converted before the fork (TypeError/ValueError, nothing forked); the children\n"
             "then report on status_pipe as stockade.cell._launch expects.");

static PyMethodDef native_methods[] = {
    {"spawn", (PyCFunction)(void (*)(void))spawn, METH_VARARGS | METH_KEYWORDS, spawn_doc},
    {"userns", (PyCFunction)userns, METH_VARARGS, userns_doc},
    {"kept", (PyCFunction)kept, METH_NOARGS, kept_doc},
    {"warm_cgroup", (PyCFunction)warm_cgroup, METH_VARARGS,
     "warm_cgroup(tasks, seconds): hold the cgroup move's semaphore in its slow mode (_migration.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "stockade.cell._native",
    "The cell launcher's children in C: fork, namespaces, the filesystem view, exec.", -1, native_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *module = PyModule_Create(&native_module);
    /* spawn() takes decoys=: _launch asks, so that an older build still loads (with_native.py). */
    if (module != NULL && PyModule_AddIntConstant(module, "DECOY_TEMPLATES", 1) < 0) Py_CLEAR(module);
    return module;
}
