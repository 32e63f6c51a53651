#include "backend/parallel/tcp_rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "core/error.h"

namespace dsv4 {

namespace {

// Hello: magic, rank, world (big-endian u32). Reply: status byte, then the id or a message.
constexpr char kMagic[8] = {'D', 'S', 'V', '4', 'R', 'D', 'V', '1'};
constexpr size_t kHelloBytes = 16;
constexpr uint8_t kOk = 0, kRefused = 1;
constexpr size_t kMessageBytes = 256;

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

Clock::time_point deadline_after(double s) {
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(s * 1e6));
}

// Waits until fd is readable (or writable); false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) fail("rendezvous: poll failed: ", std::strerror(errno));
  }
}

void send_all(int fd, const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::send(fd, b, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    DSV4_CHECK(w > 0, "rendezvous: send failed: ", std::strerror(errno));
    b += w;
    n -= static_cast<size_t>(w);
  }
}

// False when the peer closed before n bytes; throws on timeout.
bool recv_all(int fd, void* p, size_t n, Clock::time_point deadline) {
  uint8_t* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    DSV4_CHECK(wait_fd(fd, POLLIN, deadline), "rendezvous: timed out waiting for the peer");
    const ssize_t r = ::recv(fd, b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

void put_u32(uint8_t* p, uint32_t v) {
  v = htonl(v);
  std::memcpy(p, &v, 4);
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return ntohl(v);
}

void refuse(int fd, const std::string& why) {
  uint8_t reply[1 + kMessageBytes] = {kRefused};
  std::strncpy(reinterpret_cast<char*>(reply + 1), why.c_str(), kMessageBytes - 1);
  send_all(fd, reply, sizeof reply);
}

// One connection attempt to every address of host:port; -1 if none accepted.
int try_connect(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  DSV4_CHECK(rc == 0, "rendezvous: cannot resolve '", host, "': ", gai_strerror(rc));
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  return fd;
}

}  // namespace

RendezvousServer::RendezvousServer(int port) {
  DSV4_CHECK(port >= 0 && port <= 65535, "rendezvous: port ", port, " out of range");
  fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
  const bool v6 = fd_ >= 0;
  if (!v6) fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  DSV4_CHECK(fd_ >= 0, "rendezvous: socket failed: ", std::strerror(errno));
  const int one = 1, zero = 0;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 clients too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(port));
    rc = ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  if (rc != 0 || ::listen(fd_, 128) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    fail("rendezvous: cannot listen on port ", port, ": ", why);
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                      : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

RendezvousServer::~RendezvousServer() {
  if (fd_ >= 0) ::close(fd_);
}

void RendezvousServer::serve(int world, const UniqueIdBytes& id, double timeout_s) {
  DSV4_CHECK(world >= 1, "rendezvous: world size must be >= 1, got ", world);
  const auto deadline = deadline_after(timeout_s);
  std::set<uint32_t> joined;
  while (static_cast<int>(joined.size()) < world - 1) {
    DSV4_CHECK(wait_fd(fd_, POLLIN, deadline), "rendezvous: timed out after ", timeout_s, " s with ", joined.size() + 1,
               " of ", world, " ranks");
    Fd c(::accept(fd_, nullptr, nullptr));
    if (c.fd < 0) continue;
    uint8_t hello[kHelloBytes];
    // A client that hangs up or speaks another protocol is dropped, not fatal (port scanners).
    if (!recv_all(c.fd, hello, sizeof hello, deadline) || std::memcmp(hello, kMagic, sizeof kMagic) != 0) continue;
    const uint32_t rank = get_u32(hello + 8), w = get_u32(hello + 12);
    std::string why;
    if (w != static_cast<uint32_t>(world))
      why = detail::concat("rank ", rank, " expects world size ", w, ", rank 0 has ", world);
    else if (rank == 0 || rank >= w)
      why = detail::concat("rank ", rank, " is out of range [1, ", world, ")");
    else if (joined.count(rank))
      why = detail::concat("rank ", rank, " joined twice");
    if (!why.empty()) {
      refuse(c.fd, why);
      fail("rendezvous: ", why);
    }
    uint8_t reply[1 + sizeof(UniqueIdBytes)] = {kOk};
    std::memcpy(reply + 1, id.data(), id.size());
    send_all(c.fd, reply, sizeof reply);
    joined.insert(rank);
  }
}

UniqueIdBytes fetch_unique_id(const std::string& host, int port, int rank, int world, double timeout_s) {
  DSV4_CHECK(rank > 0 && rank < world, "rendezvous: rank ", rank, " cannot fetch (world ", world, ")");
  const auto deadline = deadline_after(timeout_s);
  int fd = -1;
  while ((fd = try_connect(host, port)) < 0) {
    DSV4_CHECK(ms_left(deadline) > 0, "rendezvous: rank ", rank, " could not reach rank 0 at ", host, ":", port,
               " within ", timeout_s, " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Fd c(fd);
  const int one = 1;
  ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint8_t hello[kHelloBytes];
  std::memcpy(hello, kMagic, sizeof kMagic);
  put_u32(hello + 8, static_cast<uint32_t>(rank));
  put_u32(hello + 12, static_cast<uint32_t>(world));
  send_all(c.fd, hello, sizeof hello);
  uint8_t status = 0;
  DSV4_CHECK(recv_all(c.fd, &status, 1, deadline), "rendezvous: rank 0 at ", host, ":", port, " closed the connection");
  if (status != kOk) {
    char msg[kMessageBytes] = {};
    recv_all(c.fd, msg, kMessageBytes, deadline);
    msg[kMessageBytes - 1] = 0;
    fail("rendezvous: rank 0 at ", host, ":", port, " refused rank ", rank, ": ", msg);
  }
  UniqueIdBytes id;
  DSV4_CHECK(recv_all(c.fd, id.data(), id.size(), deadline), "rendezvous: short reply from ", host, ":", port);
  return id;
}

UniqueIdBytes exchange_unique_id(const std::string& host, int port, int rank, int world, const UniqueIdBytes& id,
                                 double timeout_s) {
  if (rank != 0) return fetch_unique_id(host, port, rank, world, timeout_s);
  RendezvousServer server(port);
  server.serve(world, id, timeout_s);
  return id;
}

}  // namespace dsv4
