//===- TcpStore.h - a tiny key-value store over TCP --------------*- C++ -*-===//
//
// How ranks swap the few bytes they need before NCCL runs (the ncclUniqueId of
// each communicator group). Rank 0 serves; every rank, rank 0 included, is a
// client over one TCP connection. Keys are set once and read by anyone;
// get() waits until the key exists. Every wait is bounded and its error names
// the store's address, so a rank that never comes says so instead of hanging.
//
// Protocol (host byte order is avoided: lengths are big-endian u32):
//   request   'S' keyLen key valueLen value  -> 'K'
//             'G' keyLen key                 -> 'V' valueLen value | 'N' (not there yet)
//
//===----------------------------------------------------------------------===//

#ifndef RUNTIME_COMM_TCPSTORE_H_
#define RUNTIME_COMM_TCPSTORE_H_

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moec::runtime::comm {

class TcpStore {
public:
  /// Rank 0 (`serve`) listens on `port` of every interface (0: a free port, see port()),
  /// then connects like the others; they retry connecting to addr:port for up to
  /// `connectTimeoutSeconds`, since rank 0 may start later.
  static absl::StatusOr<std::unique_ptr<TcpStore>> open(const std::string &addr, int port, bool serve,
                                                        double connectTimeoutSeconds = 300);
  ~TcpStore();
  TcpStore(const TcpStore &) = delete;
  TcpStore &operator=(const TcpStore &) = delete;

  /// The port the store listens on (the chosen one when opened with port 0).
  int port() const { return storePort; }
  /// Sets `key` to `value` (any bytes); a later set replaces it.
  absl::Status set(const std::string &key, const std::string &value);
  /// The value of `key`, once some rank has set it; an error after `timeoutSeconds`.
  absl::StatusOr<std::string> get(const std::string &key, double timeoutSeconds);

  /// "host:port" of the store, for messages.
  std::string where() const;

private:
  class Server;
  TcpStore(std::string addr, double ioTimeoutSeconds);
  absl::Status connect(double timeoutSeconds);
  /// Sends `request` and reads the answer (tag, and the value after 'V'); a failure drops
  /// the connection, so a late answer can never be taken for the next one.
  absl::StatusOr<std::string> call(const std::string &request, double timeoutSeconds, char *tag);

  std::string addr;
  int storePort = 0;
  double ioTimeoutSeconds;
  std::unique_ptr<Server> server; // rank 0 only
  std::mutex clientMutex;         // one request at a time on clientFd
  int clientFd = -1;
};

} // namespace moec::runtime::comm

#endif // RUNTIME_COMM_TCPSTORE_H_
