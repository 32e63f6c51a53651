// Bootstrap of a multi-process group over plain TCP: rank 0 listens and hands every other rank
// an opaque 128-byte id (an ncclUniqueId; nothing here knows its meaning), so one group can
// span hosts. Each client says which rank it is and how big it thinks the world is; rank 0
// refuses mismatches, duplicate ranks and ranks out of range with a message on both ends.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace dsv4 {

using UniqueIdBytes = std::array<uint8_t, 128>;

class RendezvousServer {
 public:
  explicit RendezvousServer(int port);  // listens on every interface; 0 = any free port
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;
  int port() const { return port_; }
  // Returns once ranks 1..world-1 have each received `id`; throws after timeout_s.
  void serve(int world, const UniqueIdBytes& id, double timeout_s);

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Rank > 0: connects to host:port (retrying until the server is up or timeout_s passes) and
// returns the id rank 0 serves.
UniqueIdBytes fetch_unique_id(const std::string& host, int port, int rank, int world, double timeout_s);

// Every rank's one call: rank 0 serves `id` on `port`, the others fetch it from host:port.
UniqueIdBytes exchange_unique_id(const std::string& host, int port, int rank, int world, const UniqueIdBytes& id,
                                 double timeout_s);

}  // namespace dsv4
