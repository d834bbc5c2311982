//===- TcpStore.cpp - a tiny key-value store over TCP ---------------------===//

#include "runtime/comm/TcpStore.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace moec::runtime::comm {

namespace {

using Clock = std::chrono::steady_clock;

// Bounds on what a request may ask the server to allocate (a stray client sends garbage).
constexpr uint32_t kMaxKey = 64 << 10;
constexpr uint32_t kMaxValue = 64 << 20;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int millisLeft(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

/// Sends or receives exactly `n` bytes. With a deadline the socket is used non-blocking
/// (poll, then MSG_DONTWAIT); without one it blocks (the server side, woken by shutdown).
/// Returns 0 or an errno value (ETIMEDOUT, ECONNRESET for a closed peer).
int transferAll(int fd, void *data, size_t n, bool sending, const Clock::time_point *deadline) {
  char *p = static_cast<char *>(data);
  while (n > 0) {
    if (deadline) {
      pollfd pfd{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
      int ready = ::poll(&pfd, 1, millisLeft(*deadline));
      if (ready < 0 && errno == EINTR)
        continue;
      if (ready < 0)
        return errno;
      if (ready == 0)
        return ETIMEDOUT;
    }
    int flags = MSG_NOSIGNAL | (deadline ? MSG_DONTWAIT : 0);
    ssize_t done = sending ? ::send(fd, p, n, flags) : ::recv(fd, p, n, flags);
    if (done < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
      continue;
    if (done < 0)
      return errno;
    if (done == 0 && !sending)
      return ECONNRESET;
    p += done;
    n -= static_cast<size_t>(done);
  }
  return 0;
}

void appendU32(std::string &out, uint32_t value) {
  uint32_t big = htonl(value);
  out.append(reinterpret_cast<const char *>(&big), 4);
}

int readU32(int fd, uint32_t *value, const Clock::time_point *deadline) {
  uint32_t big = 0;
  int error = transferAll(fd, &big, 4, false, deadline);
  *value = ntohl(big);
  return error;
}

void setNoDelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); // small request/answer pairs
}

std::string errnoText(int error) { return std::strerror(error); }

std::string seconds(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", value);
  return text;
}

} // namespace

//===----------------------------------------------------------------------===//
// The server: an accept thread, one thread per connection, one map.
//===----------------------------------------------------------------------===//

class TcpStore::Server {
public:
  ~Server() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    if (wake[1] >= 0) {
      char byte = 0;
      while (::write(wake[1], &byte, 1) < 0 && errno == EINTR) {
      }
    }
    if (acceptThread.joinable())
      acceptThread.join();
    // No new connections now; shutdown wakes each thread from its blocking recv. The fds
    // are closed only after the joins, so none is reused while a thread still holds it.
    for (int fd : fds)
      ::shutdown(fd, SHUT_RDWR);
    for (std::thread &t : threads)
      t.join();
    for (int fd : {listenFd, wake[0], wake[1]})
      if (fd >= 0)
        ::close(fd);
    for (int fd : fds)
      ::close(fd);
  }

  /// Listens on every interface (dual-stack IPv6 where there is one, else IPv4), not on
  /// the address given: a host name may resolve to a loopback on rank 0's own node.
  absl::Status listen(int port, int *chosenPort) {
    if (::pipe2(wake, O_CLOEXEC) != 0)
      return absl::InternalError("pipe: " + errnoText(errno));
    int error = 0;
    for (int family : {AF_INET6, AF_INET}) {
      int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        error = errno;
        continue;
      }
      int one = 1, zero = 0;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)); // restart over TIME_WAIT
      sockaddr_storage address{};
      socklen_t length;
      if (family == AF_INET6) {
        ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
        auto *in6 = reinterpret_cast<sockaddr_in6 *>(&address);
        in6->sin6_family = AF_INET6;
        in6->sin6_addr = in6addr_any;
        in6->sin6_port = htons(static_cast<uint16_t>(port));
        length = sizeof(sockaddr_in6);
      } else {
        auto *in4 = reinterpret_cast<sockaddr_in *>(&address);
        in4->sin_family = AF_INET;
        in4->sin_addr.s_addr = htonl(INADDR_ANY);
        in4->sin_port = htons(static_cast<uint16_t>(port));
        length = sizeof(sockaddr_in);
      }
      if (::bind(fd, reinterpret_cast<sockaddr *>(&address), length) != 0 || ::listen(fd, 1024) != 0 ||
          ::getsockname(fd, reinterpret_cast<sockaddr *>(&address), &length) != 0) {
        error = errno;
        ::close(fd);
        if (error == EADDRINUSE)
          break; // the other family would say the same
        continue;
      }
      listenFd = fd;
      *chosenPort = ntohs(family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&address)->sin6_port
                                             : reinterpret_cast<sockaddr_in *>(&address)->sin_port);
      acceptThread = std::thread([this] { acceptLoop(); });
      return absl::OkStatus();
    }
    return absl::UnavailableError(
        absl::StrCat("the store cannot listen on port ", port, ": ", errnoText(error)));
  }

private:
  void acceptLoop() {
    for (;;) {
      pollfd pfds[2] = {{listenFd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      if (::poll(pfds, 2, -1) < 0) {
        if (errno == EINTR)
          continue;
        return;
      }
      if (pfds[1].revents)
        return; // the destructor
      int fd = ::accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE) // would spin: the pending connection stays queued
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue; // keep serving the others
      }
      setNoDelay(fd);
      std::lock_guard<std::mutex> lock(mutex);
      if (stopping) {
        ::close(fd);
        return;
      }
      fds.push_back(fd);
      threads.emplace_back([this, fd] { serve(fd); });
    }
  }

  /// Answers one client's requests until it goes away or sends something malformed;
  /// then shuts the connection (the peer sees it closed) but leaves closing to the destructor.
  void serve(int fd) {
    answer(fd);
    ::shutdown(fd, SHUT_RDWR);
  }

  void answer(int fd) {
    for (;;) {
      char op = 0;
      uint32_t keyLength = 0, valueLength = 0;
      if (transferAll(fd, &op, 1, false, nullptr) || (op != 'S' && op != 'G') ||
          readU32(fd, &keyLength, nullptr) || keyLength > kMaxKey)
        return;
      std::string key(keyLength, '\0');
      if (transferAll(fd, key.data(), keyLength, false, nullptr))
        return;
      std::string answer;
      if (op == 'S') {
        if (readU32(fd, &valueLength, nullptr) || valueLength > kMaxValue)
          return;
        std::string value(valueLength, '\0');
        if (transferAll(fd, value.data(), valueLength, false, nullptr))
          return;
        std::lock_guard<std::mutex> lock(mutex);
        data[key] = std::move(value);
        answer = "K";
      } else {
        std::lock_guard<std::mutex> lock(mutex);
        auto it = data.find(key);
        if (it == data.end()) {
          answer = "N";
        } else {
          answer = "V";
          appendU32(answer, static_cast<uint32_t>(it->second.size()));
          answer += it->second;
        }
      }
      if (transferAll(fd, answer.data(), answer.size(), true, nullptr))
        return;
    }
  }

  int listenFd = -1;
  int wake[2] = {-1, -1}; // the destructor writes a byte to stop acceptLoop
  std::thread acceptThread;
  std::mutex mutex; // data, fds, threads, stopping
  std::map<std::string, std::string> data;
  std::vector<int> fds;
  std::vector<std::thread> threads;
  bool stopping = false;
};

//===----------------------------------------------------------------------===//
// The client.
//===----------------------------------------------------------------------===//

TcpStore::TcpStore(std::string addr, double ioTimeoutSeconds)
    : addr(std::move(addr)), ioTimeoutSeconds(ioTimeoutSeconds) {}

TcpStore::~TcpStore() {
  if (clientFd >= 0)
    ::close(clientFd);
  server.reset(); // after our own connection is gone
}

std::string TcpStore::where() const {
  bool v6 = addr.find(':') != std::string::npos;
  return absl::StrCat(v6 ? "[" : "", addr, v6 ? "]" : "", ":", storePort);
}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::open(const std::string &addr, int port, bool serve,
                                                         double connectTimeoutSeconds) {
  if (port < 0 || port > 65535 || (port == 0 && !serve))
    return absl::InvalidArgumentError(
        absl::StrCat("store port ", port, ": expected 1..65535 (0 only to serve)"));
  std::unique_ptr<TcpStore> store(new TcpStore(addr, connectTimeoutSeconds));
  store->storePort = port;
  if (serve) {
    store->server = std::make_unique<Server>();
    if (absl::Status s = store->server->listen(port, &store->storePort); !s.ok())
      return s;
  }
  if (absl::Status s = store->connect(connectTimeoutSeconds); !s.ok())
    return s;
  return store;
}

absl::Status TcpStore::connect(double timeoutSeconds) {
  Clock::time_point deadline = after(timeoutSeconds);
  std::string lastError = "no attempt made";
  std::chrono::milliseconds pause(20);
  for (;;) {
    addrinfo hints{}, *found = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    std::string service = std::to_string(storePort);
    int gai = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &found);
    if (gai != 0)
      lastError = ::gai_strerror(gai); // DNS may not know the host yet: retry too
    for (addrinfo *ai = found; ai; ai = ai->ai_next) {
      int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) {
        lastError = errnoText(errno);
        continue;
      }
      // Non-blocking, so an unreachable host costs the time left, not the kernel's minutes.
      int error = ::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0 ? 0 : errno;
      if (error == EINPROGRESS) {
        pollfd pfd{fd, POLLOUT, 0};
        int ready;
        while ((ready = ::poll(&pfd, 1, millisLeft(deadline))) < 0 && errno == EINTR) {
        }
        socklen_t length = sizeof(error);
        if (ready <= 0)
          error = ETIMEDOUT;
        else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) != 0)
          error = errno;
      }
      if (error == 0) {
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        setNoDelay(fd);
        ::freeaddrinfo(found);
        clientFd = fd;
        return absl::OkStatus();
      }
      lastError = errnoText(error);
      ::close(fd);
    }
    if (found)
      ::freeaddrinfo(found);
    Clock::time_point now = Clock::now();
    if (now >= deadline)
      break;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now)); // then one last try
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  return absl::UnavailableError(absl::StrCat("could not connect to the store at ", where(), " within ",
                                             seconds(timeoutSeconds), " s: ", lastError));
}

absl::StatusOr<std::string> TcpStore::call(const std::string &request, double timeoutSeconds, char *tag) {
  std::lock_guard<std::mutex> lock(clientMutex);
  if (clientFd < 0)
    return absl::UnavailableError("the connection to the store at " + where() + " was lost earlier");
  Clock::time_point deadline = after(timeoutSeconds);
  int error = transferAll(clientFd, const_cast<char *>(request.data()), request.size(), true, &deadline);
  if (!error)
    error = transferAll(clientFd, tag, 1, false, &deadline);
  std::string value;
  if (!error && *tag == 'V') {
    uint32_t length = 0;
    error = readU32(clientFd, &length, &deadline);
    if (!error) {
      value.resize(length);
      error = transferAll(clientFd, value.data(), length, false, &deadline);
    }
  } else if (!error && *tag != 'K' && *tag != 'N') {
    error = EPROTO;
  }
  if (error) {
    ::close(clientFd);
    clientFd = -1;
    return absl::UnavailableError(
        absl::StrCat("the store at ", where(), " did not answer: ", errnoText(error)));
  }
  return value;
}

absl::Status TcpStore::set(const std::string &key, const std::string &value) {
  if (key.size() > kMaxKey || value.size() > kMaxValue)
    return absl::InvalidArgumentError(absl::StrCat("store key \"", key.substr(0, 100), "\": key of ",
                                                   key.size(), " bytes or value of ", value.size(),
                                                   " bytes is too large"));
  std::string request = "S";
  appendU32(request, static_cast<uint32_t>(key.size()));
  request += key;
  appendU32(request, static_cast<uint32_t>(value.size()));
  request += value;
  char tag = 0;
  absl::StatusOr<std::string> answer = call(request, ioTimeoutSeconds, &tag);
  if (!answer.ok())
    return absl::UnavailableError(absl::StrCat("setting \"", key, "\": ", answer.status().message()));
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStore::get(const std::string &key, double timeoutSeconds) {
  if (key.size() > kMaxKey)
    return absl::InvalidArgumentError(absl::StrCat("store key of ", key.size(), " bytes is too large"));
  std::string request = "G";
  appendU32(request, static_cast<uint32_t>(key.size()));
  request += key;
  Clock::time_point start = Clock::now(), deadline = after(timeoutSeconds);
  std::chrono::milliseconds pause(1);
  for (;;) {
    // The server answers at once: a short deadline needs no long wait for the answer itself.
    char tag = 0;
    absl::StatusOr<std::string> answer = call(request, std::max(timeoutSeconds, 10.0), &tag);
    if (!answer.ok())
      return absl::UnavailableError(absl::StrCat("getting \"", key, "\": ", answer.status().message()));
    if (tag == 'V')
      return answer;
    Clock::time_point now = Clock::now();
    if (now >= deadline) {
      double waited = std::chrono::duration<double>(now - start).count();
      return absl::DeadlineExceededError(absl::StrCat("timed out after ", seconds(waited),
                                                      " s waiting for key \"", key, "\" in the store at ",
                                                      where(), " (did every rank start?)"));
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
}

} // namespace moec::runtime::comm
