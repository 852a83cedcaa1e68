// A scratch directory of a multi-rank test: made by world rank 0 under /tmp, its path shared with
// every rank, removed at the end (after a barrier).
#pragma once
#include <catch2/catch.hpp>
#include <stdlib.h>

#include <filesystem>
#include <span>
#include <string>

#include "triax/distributed/comm/comm.h"

namespace triax::test {

class SharedDir {
 public:
  explicit SharedDir(Communicator& world, const std::string& tag = "ckpt") : world_(world) {
    std::string p;
    if (world.rank() == 0) {
      std::string tmpl = "/tmp/triax_" + tag + "_XXXXXX";
      REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
      p = tmpl;
    }
    int len[1] = {static_cast<int>(p.size())};
    world.broadcast(std::span<int>(len), 0).wait();
    p.resize(static_cast<size_t>(len[0]));
    world.broadcast(std::span<char>(p.data(), p.size()), 0).wait();
    path_ = p;
  }
  ~SharedDir() {
    world_.barrier().wait();
    if (world_.rank() == 0) std::filesystem::remove_all(path_);
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  Communicator& world_;
  std::string path_;
};

}  // namespace triax::test
