// The Triton worker processes (triton.h: run_worker): `OPFORGE_TRITON_PYTHON` running
// `OPFORGE_TRITON_WORKER --serve`, which answers one JSON request per line. A worker stays up
// between requests, so that the imports of Triton and of the kernel file's own imports (torch,
// for most kernels nobody here wrote) are paid once per process rather than once per compile; a
// worker serves one request at a time, and a thread that finds none idle starts another, so a
// compile never blocks another thread's. A worker started in another environment (variables
// other than opforge's changed since) is not reused: it would compile with what the process no
// longer says.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "triton.h"

extern char** environ;

namespace opforge::detail::triton {
namespace {

/// Idle workers kept per process (as many as one compile uses at once); a worker started while
/// that many are busy is let go afterwards.
constexpr size_t kIdleWorkers = kParallelWorkers;

/// The process's environment as one text, less the variables no compile reads and test runs
/// change per test: opforge's own but the worker's command (OPFORGE_TRITON_*; tests give each
/// case a kernel cache of its own), and pytest's PYTEST_CURRENT_TEST. A worker serves only the
/// environment it was started in.
std::string environment_text() {
  std::string text;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if ((entry.starts_with("OPFORGE_") && !entry.starts_with("OPFORGE_TRITON_")) ||
        entry.starts_with("PYTEST_CURRENT_TEST="))
      continue;
    text.append(entry).push_back('\0');
  }
  return text;
}

/// One worker process and its pipes (the parent's ends).
class Worker {
 public:
  /// Starts `python worker --serve`; throws InternalError naming `what` where it cannot.
  Worker(const std::string& python, const std::string& worker, std::string environment, const std::string& what)
      : environment_(std::move(environment)), command_(python + " " + worker) {
    int in[2], out[2], err[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0)
      throw InternalError("opforge: " + what + ": cannot make pipes for the Triton worker: " + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    std::vector<std::string> argv_text = {python, worker, "--serve"};
    std::vector<char*> argv;
    for (auto& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int spawned = ::posix_spawnp(&pid_, python.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    in_ = in[1], out_ = out[0], err_ = err[0];
    if (spawned != 0) {
      pid_ = -1;
      close_all();
      throw InternalError("opforge: " + what + ": cannot start the Triton worker (" + command_ +
                          "): " + std::strerror(spawned));
    }
    ::fcntl(in_, F_SETFL, ::fcntl(in_, F_GETFL) | O_NONBLOCK);
  }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  /// Closes the worker's stdin (it exits at the end of its input) and waits for it.
  ~Worker() {
    close_all();
    if (pid_ > 0) reap();
  }

  const std::string& environment() const { return environment_; }

  /// Sends `request` and returns the answer line; throws InternalError naming `what`, the
  /// worker's exit status and its stderr's tail where the worker ends without answering.
  std::string exchange(const std::string& request, const std::string& what) {
    const std::string line = request + "\n";
    std::string answer, errors;
    size_t written = 0;
    ::signal(SIGPIPE, SIG_IGN);
    // Write the request and read both streams at once: a worker blocked on a full pipe would wait forever.
    pollfd fds[3] = {{in_, POLLOUT, 0}, {out_, POLLIN, 0}, {err_, POLLIN, 0}};
    bool ended = false;
    while (!ended && answer.find('\n') == std::string::npos) {
      if (written == line.size()) fds[0].fd = -1;
      if (::poll(fds, 3, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      if (fds[0].fd >= 0 && (fds[0].revents & (POLLOUT | POLLERR | POLLHUP))) {
        const ssize_t w = ::write(in_, line.data() + written, line.size() - written);
        if (w > 0) written += static_cast<size_t>(w);
        if (w < 0 && errno != EAGAIN && errno != EINTR) fds[0].fd = -1;  // the worker is gone: its output says why
      }
      for (int k = 1; k < 3; ++k) {
        if (fds[k].fd < 0 || !(fds[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        char buf[65536];
        const ssize_t r = ::read(fds[k].fd, buf, sizeof(buf));
        if (r > 0) {
          (k == 1 ? answer : errors).append(buf, static_cast<size_t>(r));
        } else if (r == 0 || errno != EINTR) {
          fds[k].fd = -1;
          if (k == 1) ended = true;
        }
      }
    }
    const size_t end = answer.find('\n');
    if (end != std::string::npos && end > 0) return answer.substr(0, end);
    // No answer: the worker ended (an internal error, its traceback on stderr); say how.
    close_all();
    int status = 0;
    if (pid_ > 0) status = reap();
    const std::string tail = errors.size() > 4000 ? errors.substr(errors.size() - 4000) : errors;
    throw InternalError("opforge: " + what + ": the Triton worker (" + command_ + ") failed" +
                        (WIFEXITED(status) ? " with status " + std::to_string(WEXITSTATUS(status)) : "") + ":\n" +
                        tail);
  }

 private:
  void close_all() {
    for (int* fd : {&in_, &out_, &err_})
      if (*fd >= 0) ::close(*fd), *fd = -1;
  }
  int reap() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }

  std::string environment_, command_;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
};

std::mutex g_mutex;
std::vector<std::unique_ptr<Worker>>& idle() {
  static auto* workers = new std::vector<std::unique_ptr<Worker>>;  // never destroyed: the workers end with us
  return *workers;
}

}  // namespace

bool can_compile() { return !rtc::env("OPFORGE_TRITON_PYTHON").empty() && !rtc::env("OPFORGE_TRITON_WORKER").empty(); }

std::optional<std::string> run_worker(const std::string& request, const std::string& what) {
  if (!can_compile()) return std::nullopt;
  std::string environment = environment_text();
  std::unique_ptr<Worker> worker;
  std::vector<std::unique_ptr<Worker>> stale;  // started in an environment this process no longer has
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto& workers = idle();
    while (!workers.empty() && !worker) {
      std::unique_ptr<Worker> w = std::move(workers.back());
      workers.pop_back();
      (w->environment() == environment ? worker : stale.emplace_back()) = std::move(w);
    }
  }
  stale.clear();  // outside the lock: each waits for its process to end
  if (!worker)
    worker = std::make_unique<Worker>(rtc::env("OPFORGE_TRITON_PYTHON"), rtc::env("OPFORGE_TRITON_WORKER"),
                                      std::move(environment), what);
  std::string answer = worker->exchange(request, what);  // a worker that fails is not kept
  std::lock_guard<std::mutex> lock(g_mutex);
  if (idle().size() < kIdleWorkers) idle().push_back(std::move(worker));
  return answer;
}

}  // namespace opforge::detail::triton
