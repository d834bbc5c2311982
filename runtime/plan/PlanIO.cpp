//===- PlanIO.cpp - read and write plan files -----------------------------===//

#include "runtime/plan/PlanIO.h"

#include <cerrno>
#include <climits>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "runtime/plan/PlanFormat.h"
#include "runtime/plan/PlanValidator.h"

namespace moec::plan {
namespace {

absl::Status errnoError(int error, absl::string_view path, absl::string_view what) {
  return absl::ErrnoToStatus(error, absl::StrCat(path, ": ", what));
}

// Reads the whole file with plain syscalls so that errors keep their errno.
absl::Status readFile(const std::string &path, std::string &bytes) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errnoError(errno, path, "cannot open");
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    int error = errno;
    ::close(fd);
    return errnoError(error, path, "cannot stat");
  }
  if (S_ISDIR(info.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a plan"));
  }
  bytes.clear();
  char chunk[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0) {
      int error = errno;
      ::close(fd);
      return errnoError(error, path, "cannot read");
    }
    if (n == 0)
      break;
    bytes.append(chunk, static_cast<size_t>(n));
  }
  ::close(fd);
  return absl::OkStatus();
}

// Returns 0 or the errno of the failed write.
int writeAll(int fd, const std::string &bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      return errno;
    done += static_cast<size_t>(n);
  }
  return 0;
}

std::string parentDirectory(const std::string &path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

} // namespace

absl::StatusOr<Plan> loadPlan(const std::string &path) {
  std::string bytes;
  if (absl::Status status = readFile(path, bytes); !status.ok())
    return status;
  if (bytes.empty())
    return absl::InvalidArgumentError(absl::StrCat(path, ": empty file, not a plan"));
  Plan plan;
  if (bytes.size() > INT_MAX || !plan.ParseFromString(bytes))
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a plan (the bytes do not parse as a moec.plan.Plan protobuf)"));
  // Other protobufs, and even some text files, parse as a Plan made of
  // unknown fields; a missing version tells them apart from a plan of
  // another version.
  if (plan.version() == 0)
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not a plan (no version field; this runtime reads version ", kPlanVersion, ")"));
  if (absl::Status status = validatePlan(plan); !status.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", status.message()));
  return plan;
}

absl::Status savePlan(const Plan &plan, const std::string &path) {
  std::string bytes;
  if (!plan.SerializeToString(&bytes))
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot serialize the plan (protobuf messages are limited to 2 GiB)"));

  // A device or a pipe (-o /dev/null, a FIFO): written in place. Renaming a temporary over it
  // would replace it with a regular file.
  if (struct stat info; ::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode) && !S_ISDIR(info.st_mode)) {
    int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0)
      return errnoError(errno, path, "cannot open");
    int error = writeAll(fd, bytes);
    if (::close(fd) != 0 && !error)
      error = errno;
    return error ? errnoError(error, path, "cannot write") : absl::OkStatus();
  }
  std::string temp = absl::StrCat(path, ".tmp.", ::getpid());
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return errnoError(errno, temp, "cannot create");
  auto fail = [&](int error, absl::string_view what) {
    ::unlink(temp.c_str());
    return errnoError(error, temp, what);
  };
  if (int error = writeAll(fd, bytes)) {
    ::close(fd);
    return fail(error, "cannot write");
  }
  // Without the fsync a crash soon after the rename can leave `path` empty.
  if (::fsync(fd) != 0) {
    int error = errno;
    ::close(fd);
    return fail(error, "cannot fsync");
  }
  if (::close(fd) != 0)
    return fail(errno, "cannot close");
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    int error = errno;
    ::unlink(temp.c_str());
    return errnoError(error, path, absl::StrCat("cannot rename ", temp, " over it"));
  }
  // Makes the rename itself durable. The new file is already complete and in
  // place, so a filesystem that cannot fsync directories is not an error.
  int dir = ::open(parentDirectory(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
  return absl::OkStatus();
}

} // namespace moec::plan
