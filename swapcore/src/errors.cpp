// errno symbols for messages: "... failed: Input/output error (EIO)".
#include <cerrno>
#include <string>

#include "swapnet/swapcore.h"

namespace swapnet {

std::string errno_name(int err) {
  switch (err) {
    case EIO: return "EIO";
    case EINVAL: return "EINVAL";
    case EINTR: return "EINTR";
    case EAGAIN: return "EAGAIN";
    case ENOMEM: return "ENOMEM";
    case ENOENT: return "ENOENT";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case ENOSYS: return "ENOSYS";
    case EOPNOTSUPP: return "EOPNOTSUPP";
    case EFAULT: return "EFAULT";
    case EBADF: return "EBADF";
    case ENOSPC: return "ENOSPC";
    case EISDIR: return "EISDIR";
    case EEXIST: return "EEXIST";
    case EROFS: return "EROFS";
    case ECANCELED: return "ECANCELED";
    case EFBIG: return "EFBIG";
    case EDQUOT: return "EDQUOT";
    case ESTALE: return "ESTALE";
    case ENOTDIR: return "ENOTDIR";
    default: return "errno " + std::to_string(err);
  }
}

}  // namespace swapnet
