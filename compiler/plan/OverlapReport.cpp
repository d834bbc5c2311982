//===- OverlapReport.cpp - what runs under the communication --------------===//
//
// A replay of the plan as the device issues it: each stream runs its steps in
// list order; a wait holds its stream until the other stream has reached the
// matching record. Durations are floors, not measurements: what the prediction
// is good for is the shape of the schedule (which collectives the compute can
// hide, and how much is left exposed), not the step time.
//
//===----------------------------------------------------------------------===//

#include "compiler/plan/OverlapReport.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

namespace moec::compiler {

namespace {

struct Interval {
  double begin = 0, end = 0;
};

double overlapOf(const Interval &a, const Interval &b) {
  return std::max(0.0, std::min(a.end, b.end) - std::max(a.begin, b.begin));
}

const char *phaseText(plan::Phase phase) {
  return phase == plan::FORWARD ? "forward" : phase == plan::BACKWARD ? "backward" : "recompute";
}

} // namespace

void printOverlap(const Program &program, const std::vector<int64_t> &sentBytes, llvm::raw_ostream &os,
                  const OverlapRates &rates) {
  const size_t n = program.steps.size();
  std::vector<double> duration(n, 0.0);
  double compute = 0, communication = 0;
  for (size_t i = 0; i < n; ++i) {
    const ProgramStep &step = program.steps[i];
    if (step.event != ProgramStep::Event::None)
      continue;
    if (!step.collective.empty()) {
      double rate = step.collective == "all_reduce" || step.collective == "send_recv" ? rates.allReduce
                                                                                      : rates.allToAll;
      duration[i] = double(i < sentBytes.size() ? sentBytes[i] : 0) / rate;
      communication += duration[i];
      continue;
    }
    int64_t bytes = 0;
    for (int id : step.inputs)
      bytes += program.buffers[id].bytes;
    for (int id : step.outputs)
      bytes += program.buffers[id].bytes;
    duration[i] = std::max(double(step.flops) / rates.flops, double(bytes) / rates.memory);
    compute += duration[i];
  }

  // The replay: a clock per stream, the time each event was recorded.
  std::vector<double> clock(std::max(1, program.numStreams), 0.0);
  std::vector<double> recorded(std::max(0, program.numEvents), 0.0);
  std::vector<Interval> when(n);
  for (size_t i = 0; i < n; ++i) {
    const ProgramStep &step = program.steps[i];
    double &t = clock[std::min<size_t>(step.stream, clock.size() - 1)];
    if (step.event == ProgramStep::Event::Record && step.eventId >= 0 && step.eventId < program.numEvents)
      recorded[step.eventId] = t;
    else if (step.event == ProgramStep::Event::Wait && step.eventId >= 0 && step.eventId < program.numEvents)
      t = std::max(t, recorded[step.eventId]);
    when[i] = {t, t + duration[i]};
    t += duration[i];
  }
  double step = *std::max_element(clock.begin(), clock.end());

  os << "\ncommunication and compute (predicted: kernels at their floors, " << llvm::format("%.0f", rates.flops / 1e12)
     << " TFLOP/s or " << llvm::format("%.2f", rates.memory / 1e12) << " TB/s; collectives at "
     << llvm::format("%.0f", rates.allToAll / 1e9) << " GB/s all-to-all, " << llvm::format("%.0f", rates.allReduce / 1e9)
     << " GB/s all-reduce and sends):\n";
  os << llvm::format("  streams %d: compute %.3f ms, communication %.3f ms; the step %.3f ms (one stream: %.3f ms)\n",
                     program.numStreams, compute * 1e3, communication * 1e3, step * 1e3,
                     (compute + communication) * 1e3);
  double exposed = std::max(0.0, step - compute);
  os << llvm::format("  exposed communication %.3f ms of %.3f (%.0f%%), %.1f%% of the step\n", exposed * 1e3,
                     communication * 1e3, communication > 0 ? 100.0 * exposed / communication : 0.0,
                     step > 0 ? 100.0 * exposed / step : 0.0);
  if (program.numStreams < 2)
    return;

  // Per collective and phase: its time, how much of it runs while the other stream computes,
  // and the kernels that run meanwhile (by time under the collective).
  struct Row {
    int64_t count = 0;
    double time = 0, hidden = 0;
    std::map<std::string, double> under;
  };
  std::map<std::tuple<std::string, int>, Row> rows;
  for (size_t i = 0; i < n; ++i) {
    const ProgramStep &comm = program.steps[i];
    if (comm.collective.empty() || duration[i] <= 0)
      continue;
    Row &row = rows[{comm.collective, static_cast<int>(comm.phase)}];
    ++row.count;
    row.time += duration[i];
    for (size_t j = 0; j < n; ++j) {
      const ProgramStep &other = program.steps[j];
      if (other.stream == comm.stream || !other.collective.empty() || other.event != ProgramStep::Event::None)
        continue;
      if (double o = overlapOf(when[i], when[j]); o > 0) {
        row.hidden += o;
        row.under[llvm::StringRef(other.kernel).split(".backward").first.str()] += o;
      }
    }
  }
  os << llvm::format("  %-16s %-9s %6s %10s %10s  %s\n", "collective", "phase", "count", "time ms", "hidden ms",
                     "runs under (ms of it)");
  for (auto &[key, row] : rows) {
    std::vector<std::pair<double, std::string>> under;
    for (auto &[kernel, t] : row.under)
      under.push_back({t, kernel});
    std::sort(under.begin(), under.end(), [](auto &a, auto &b) { return a.first > b.first; });
    std::string list;
    for (size_t k = 0; k < under.size() && k < 4; ++k)
      list += (k ? ", " : "") + under[k].second + llvm::formatv(" {0:F3}", under[k].first * 1e3).str();
    if (under.empty())
      list = "nothing: exposed";
    os << llvm::format("  %-16s %-9s %6lld %10.3f %10.3f  %s\n", std::get<0>(key).c_str(),
                       phaseText(static_cast<plan::Phase>(std::get<1>(key))), static_cast<long long>(row.count),
                       row.time * 1e3, row.hidden * 1e3, list.c_str());
  }
}

} // namespace moec::compiler
