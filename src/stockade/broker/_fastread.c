/*
 * stockade.broker._fastread: the plain case of an fs.read, in one call.
 *
 * FileAccess.read (broker/_fs.py) reaches a file beneath its grant with about
 * ten system calls and a check between each two. Made one by one from Python,
 * with their wrappers, they were the largest part of an fs.read intent in the
 * daemon's loop. read_beneath() makes the same calls, with the same flags and
 * the same checks, in C, and gives up (returns None) at the first thing that
 * is not the plain case: a symbolic link anywhere (even one the grant may
 * follow), a mount point, a name that is not one plain component, a directory
 * the cell cannot search, a file that is not regular, not readable by the cell
 * or too large, a file that changed between the look and the open, any error.
 * FileAccess.read then does everything again in Python, which decides and
 * explains. So this file never refuses and never explains: it can only return
 * what the Python path would return for the same file, and
 * tests/broker/test_fastread.py checks the two side by side on the cases the
 * Python path refuses.
 *
 * The file is read like _read_bounded does: until read() returns 0 or more
 * than `limit` bytes came (then: None, and Python says it is too large).
 * The GIL is released for the system calls, once, as os.read would for each.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_openat2
#define SYS_openat2 437 /* Linux 5.6, the same number on every architecture */
#endif

/* <linux/openat2.h>, spelled out for C libraries older than the call. */
struct fastread_open_how {
    uint64_t flags;
    uint64_t mode;
    uint64_t resolve;
};
#define FASTREAD_RESOLVE_NO_XDEV 0x01
#define FASTREAD_RESOLVE_NO_MAGICLINKS 0x02
#define FASTREAD_RESOLVE_NO_SYMLINKS 0x04
#define FASTREAD_RESOLVE_BENEATH 0x08
/* broker/_fs.py's BENEATH: below a descriptor, never a link, never another mount. */
#define FASTREAD_BENEATH                                                                               \
    (FASTREAD_RESOLVE_BENEATH | FASTREAD_RESOLVE_NO_SYMLINKS | FASTREAD_RESOLVE_NO_MAGICLINKS |        \
     FASTREAD_RESOLVE_NO_XDEV)

#define MAX_NAMES 256 /* components below the grant; a deeper path takes the Python path */

static int open2(int dirfd, const char *path, uint64_t flags, uint64_t resolve) {
    struct fastread_open_how how = {flags | O_CLOEXEC, 0, resolve};
    return (int)syscall(SYS_openat2, dirfd, path, &how, sizeof how);
}

/* Who the cell is, for _permits: its host uid and gid, and in a write grant
 * (when the daemon is root) also the owner of the grant's directory, whom the
 * cell's idmapped mount stands for. */
struct identity {
    uid_t uid, owner_uid;
    gid_t gid, owner_gid;
    int as_owner;
};

/* broker/_fs.py's _permits: owner bits for the owner, else group bits for the
 * group, else the others' bits, as for an unprivileged process. */
static int permits(const struct stat *st, const struct identity *who, unsigned want) {
    unsigned bits;
    if (st->st_uid == who->uid || (who->as_owner && st->st_uid == who->owner_uid))
        bits = (st->st_mode >> 6) & 7;
    else if (st->st_gid == who->gid || (who->as_owner && st->st_gid == who->owner_gid))
        bits = (st->st_mode >> 3) & 7;
    else
        bits = st->st_mode & 7;
    return (bits & want) == want;
}

static int plain_name(const char *name, Py_ssize_t size) {
    if (size == 0 || (size_t)size != strlen(name) || strchr(name, '/') != NULL) return 0;
    return strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* The walk and the read, without the GIL. 0 and the data in *out (malloc'd,
 * *size bytes), or -1: not the plain case. */
static int walk_and_read(const char *root, const char *const *names, Py_ssize_t count,
                         struct identity *who, size_t limit, char **out, size_t *size) {
    struct stat st, file, opened;
    int dir = open2(AT_FDCWD, root, O_PATH, FASTREAD_RESOLVE_NO_MAGICLINKS | FASTREAD_RESOLVE_NO_SYMLINKS);
    int fd = -1, ok = -1;
    char *buf = NULL;
    if (dir < 0) return -1;
    if (fstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) goto done;
    who->owner_uid = st.st_uid;
    who->owner_gid = st.st_gid;
    for (Py_ssize_t i = 0; i + 1 < count; i++) {
        int next;
        if (!permits(&st, who, 1)) goto done;
        next = open2(dir, names[i], O_PATH | O_DIRECTORY | O_NOFOLLOW, FASTREAD_BENEATH);
        if (next < 0) goto done;
        close(dir);
        dir = next;
        if (fstat(dir, &st) != 0) goto done;
    }
    if (!permits(&st, who, 1)) goto done;
    if (fstatat(dir, names[count - 1], &file, AT_SYMLINK_NOFOLLOW) != 0) goto done;
    if (!S_ISREG(file.st_mode) || !permits(&file, who, 4) || (uint64_t)file.st_size > limit) goto done;
    fd = open2(dir, names[count - 1], O_RDONLY | O_NONBLOCK | O_NOFOLLOW, FASTREAD_BENEATH);
    if (fd < 0 || fstat(fd, &opened) != 0) goto done;
    if (opened.st_dev != file.st_dev || opened.st_ino != file.st_ino || !S_ISREG(opened.st_mode)) goto done;
    {
        size_t cap = (size_t)file.st_size + 1, got = 0;
        if (cap > limit + 1) cap = limit + 1;
        buf = malloc(cap);
        if (buf == NULL) goto done;
        for (;;) {
            ssize_t n;
            if (got == cap) {
                char *bigger;
                if (cap > limit) goto done; /* more than limit bytes: too large */
                cap = cap * 2 > limit + 1 ? limit + 1 : cap * 2;
                bigger = realloc(buf, cap);
                if (bigger == NULL) goto done;
                buf = bigger;
            }
            n = read(fd, buf + got, cap - got);
            if (n < 0) {
                if (errno == EINTR) continue;
                goto done;
            }
            if (n == 0) break;
            got += (size_t)n;
        }
        if (got > limit) goto done;
        *out = buf;
        *size = got;
        buf = NULL;
        ok = 0;
    }
done:
    free(buf);
    if (fd >= 0) close(fd);
    close(dir);
    return ok;
}

static PyObject *read_beneath(PyObject *self, PyObject *args) {
    PyObject *names_tuple, *result;
    const char *root;
    Py_ssize_t root_size, count;
    unsigned long long limit;
    unsigned int uid, gid;
    int as_owner, status;
    const char *names[MAX_NAMES];
    char *data = NULL;
    size_t size = 0;
    struct identity who;
    (void)self;
    if (!PyArg_ParseTuple(args, "y#O!IIpK", &root, &root_size, &PyTuple_Type, &names_tuple, &uid, &gid,
                          &as_owner, &limit))
        return NULL;
    count = PyTuple_GET_SIZE(names_tuple);
    if (root_size == 0 || (size_t)root_size != strlen(root) || root[0] != '/' || count < 1 ||
        count > MAX_NAMES || limit > SIZE_MAX / 2)
        Py_RETURN_NONE;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyTuple_GET_ITEM(names_tuple, i);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "read_beneath: every name must be bytes");
            return NULL;
        }
        names[i] = PyBytes_AS_STRING(item);
        if (!plain_name(names[i], PyBytes_GET_SIZE(item))) Py_RETURN_NONE;
    }
    who.uid = (uid_t)uid;
    who.gid = (gid_t)gid;
    who.as_owner = as_owner;
    /* The bytes objects stay alive without the GIL: the caller's tuple holds them. */
    Py_BEGIN_ALLOW_THREADS
    status = walk_and_read(root, names, count, &who, (size_t)limit, &data, &size);
    Py_END_ALLOW_THREADS
    if (status != 0) Py_RETURN_NONE;
    result = PyBytes_FromStringAndSize(data, (Py_ssize_t)size);
    free(data);
    return result;
}

PyDoc_STRVAR(read_beneath_doc,
             "read_beneath(root, names, uid, gid, as_owner, limit) -> bytes | None\n\n"
             "The content of the regular file root/names[0]/.../names[-1], reached as\n"
             "stockade.broker._fs.FileAccess.read reaches it, with the permissions of the cell\n"
             "(uid, gid; as_owner: also the grant directory's owner); None whenever anything is\n"
             "not the plain case, and FileAccess.read's Python path must decide.");

static PyMethodDef fastread_methods[] = {
    {"read_beneath", read_beneath, METH_VARARGS, read_beneath_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastread_module = {
    PyModuleDef_HEAD_INIT, "stockade.broker._fastread",
    "The plain case of the broker's fs.read in one call (see broker/_fs.py).", -1, fastread_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastread(void) { return PyModule_Create(&fastread_module); }
