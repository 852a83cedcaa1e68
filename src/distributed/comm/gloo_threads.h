// The threads that carry the Gloo backend's blocking calls (src/distributed/comm/gloo_comm.cpp): a
// completion flag Work polls, a serial worker per communicator for its collectives, and a pool
// of waiters for point-to-point messages. Private to src/distributed/comm.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace triax::detail {

struct Completion {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  bool timed_out = false;
  std::string error;

  void complete(std::string err = {}, bool timeout = false) {
    {
      std::lock_guard<std::mutex> l(m);
      done = true;
      error = std::move(err);
      timed_out = timeout;
    }
    cv.notify_all();
  }
  // True once done; sleeps up to `wait` for it.
  bool wait_for(std::chrono::microseconds wait) {
    std::unique_lock<std::mutex> l(m);
    if (!done) cv.wait_for(l, wait, [&] { return done; });
    return done;
  }
};

// Runs tasks one at a time in submission order (a communicator's collectives).
class SerialWorker {
 public:
  SerialWorker() : thread_([this] { run(); }) {}
  ~SerialWorker() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void submit(std::function<void()> f) {
    {
      std::lock_guard<std::mutex> l(m_);
      queue_.push_back(std::move(f));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> f;
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, and every task has run
        f = std::move(queue_.front());
        queue_.pop_front();
      }
      f();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

// Threads that each block in one point-to-point wait; a task never waits behind another (an idle
// thread takes it, or a new one starts), so completions are seen in any order. Process-wide and
// never destroyed: its threads end with the process.
class WaiterPool {
 public:
  static WaiterPool& get() {
    static auto* pool = new WaiterPool();
    return *pool;
  }
  void submit(std::function<void()> f) {
    std::lock_guard<std::mutex> l(m_);
    queue_.push_back(std::move(f));
    if (idle_ >= queue_.size()) {
      cv_.notify_one();
      return;
    }
    std::thread([this] { run(); }).detach();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> l(m_);
    for (;;) {
      ++idle_;
      cv_.wait(l, [&] { return !queue_.empty(); });
      --idle_;
      auto f = std::move(queue_.front());
      queue_.pop_front();
      l.unlock();
      f();
      l.lock();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t idle_ = 0;
};

}  // namespace triax::detail
