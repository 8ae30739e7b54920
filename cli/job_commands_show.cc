// meshctl list, status, describe and nodes (job_commands.h): the job
// commands that show what the coordinator knows, and how a job is rendered
// as a table (RenderJob, which wait uses too).

#include <algorithm>
#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/job_client.h"
#include "cli/job_commands_internal.h"
#include "cli/job_json.h"
#include "cli/job_spec_file.h"
#include "cli/meshctl.h"
#include "cli/output.h"

namespace mesh::cli {

using mesh::v1::JobSpec;

namespace {

std::string OrDash(const std::string& text) { return text.empty() ? "-" : text; }

// Argv for people: arguments with spaces or quotes are single-quoted.
std::string ShowArgv(const google::protobuf::RepeatedPtrField<std::string>& argv) {
  std::vector<std::string> shown;
  for (const std::string& arg : argv) {
    if (!arg.empty() && arg.find_first_of(" \t\n'\"\\$`") == std::string::npos) {
      shown.push_back(arg);
    } else {
      std::string quoted = "'";
      for (char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      shown.push_back(quoted + "'");
    }
  }
  return absl::StrJoin(shown, " ");
}

template <typename Map>
std::string ShowMap(const Map& map) {
  std::map<std::string, std::string> sorted(map.begin(), map.end());
  return OrDash(absl::StrJoin(sorted, ", ", absl::PairFormatter("=")));
}

std::string ShowTime(int64_t unix_ms, absl::Time now) {
  if (unix_ms == 0) return "-";
  return absl::StrCat(TimeToJson(unix_ms).get<std::string>(), " (", Age(unix_ms, now), " ago)");
}

// Node names for a table cell: at most three, then a count.
std::string ShowNodes(const google::protobuf::RepeatedPtrField<std::string>& nodes) {
  if (nodes.empty()) return "-";
  std::vector<std::string> shown(nodes.begin(), nodes.begin() + std::min(nodes.size(), 3));
  std::string cell = absl::StrJoin(shown, ",");
  if (nodes.size() > 3) absl::StrAppend(&cell, ",+", nodes.size() - 3);
  return cell;
}

std::string ShowState(const Job& job) {
  std::string state = JobStateName(job.state());
  if (!job.pending_reason().empty()) absl::StrAppend(&state, " (", job.pending_reason(), ")");
  return state;
}

// The failure a job records, labelled by what it did to the job: the root
// cause of a FAILED job, else the failure an earlier generation restarted
// after (a RUNNING job with a "node lost" cause is one that recovered).
std::vector<std::string> RootCauseRow(const Job& job) {
  const std::string line = RootCauseLine(job.root_cause());
  if (job.state() == mesh::v1::JOB_STATE_FAILED) return {"Root cause:", line};
  if (job.root_cause().generation() < job.generation()) {
    return {"Last failure:",
            absl::StrCat(line, " (restarted as generation ", job.generation(), ")")};
  }
  return {"Last failure:", line};
}

// status: the short view.
std::vector<std::vector<std::string>> SummaryRows(const Job& job, absl::Time now) {
  std::vector<std::vector<std::string>> rows = {
      {"ID:", job.id()},
      {"Name:", OrDash(job.spec().name())},
      {"Owner:", OrDash(job.owner())},
      {"State:", ShowState(job)},
      {"Generation:", absl::StrCat(job.generation(), " (restarts ", job.restarts(), "/",
                                   job.spec().max_restarts(), ")")},
  };
  if (job.nodes_size() > 0) {
    rows.push_back({"Nodes:", absl::StrCat(absl::StrJoin(job.nodes(), ", "), " (world size ",
                                           job.nodes_size() * job.spec().nproc_per_node(), ")")});
  } else {
    rows.push_back({"Nodes:", "- (not placed)"});
  }
  rows.push_back({"Created:", ShowTime(job.create_time_unix_ms(), now)});
  rows.push_back({"Updated:", ShowTime(job.update_time_unix_ms(), now)});
  if (job.has_root_cause()) rows.push_back(RootCauseRow(job));
  return rows;
}

// "group", or "in_place (dim dp)".
std::string RestartPolicyLine(const JobSpec& spec) {
  const std::string policy = RestartPolicyText(spec.restart_policy());
  if (spec.restart_policy() != mesh::v1::RESTART_POLICY_IN_PLACE || spec.in_place_dim().empty()) {
    return policy;
  }
  return absl::StrCat(policy, " (dim ", spec.in_place_dim(), ")");
}

void RenderJobTable(const Job& job, bool detail, std::ostream& out) {
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows = SummaryRows(job, now);
  if (detail) {
    const JobSpec& spec = job.spec();
    // Beside the restarts it governs.
    auto generation = std::find_if(rows.begin(), rows.end(),
                                   [](const auto& row) { return row.front() == "Generation:"; });
    if (generation != rows.end()) ++generation;
    rows.insert(generation, std::vector<std::string>{"Restart policy:", RestartPolicyLine(spec)});
    const int32_t max = spec.nodes().max() == 0 ? spec.nodes().min() : spec.nodes().max();
    const std::string requested =
        spec.nodes().min() == max ? absl::StrCat(max) : absl::StrCat(spec.nodes().min(), ":", max);
    std::vector<std::string> shape;
    for (int64_t size : spec.mesh_shape()) shape.push_back(absl::StrCat(size));
    rows.push_back({"Command:", ShowArgv(spec.command())});
    rows.push_back({"Working dir:", OrDash(spec.working_dir())});
    rows.push_back({"Env:", ShowMap(spec.env())});
    rows.push_back({"Labels:", ShowMap(spec.labels())});
    rows.push_back(
        {"Nodes wanted:", spec.nodes().min() == max
                              ? requested
                              : absl::StrCat(requested, " (grow: ", GrowText(spec), ")")});
    rows.push_back({"Procs/node:", absl::StrCat(spec.nproc_per_node())});
    rows.push_back({"GPUs/proc:", absl::StrCat(spec.gpus_per_proc())});
    rows.push_back({"Mesh:", absl::StrCat("[", absl::StrJoin(shape, ", "), "] (",
                                          absl::StrJoin(spec.mesh_dim_names(), ", "), ")")});
    rows.push_back({"Deadline:", spec.deadline_seconds() == 0
                                     ? std::string("none")
                                     : absl::StrCat(spec.deadline_seconds(), "s")});
    rows.push_back({"Hang timeout:", absl::StrCat(HangTimeoutSeconds(spec), "s (on hang: ",
                                                  HangPolicyName(spec.on_hang()), ")")});
    if (spec.memory_per_proc_bytes() > 0 || spec.max_pids() > 0) {
      rows.push_back({"Limits:", absl::StrCat("memory per proc ",
                                              spec.memory_per_proc_bytes() > 0
                                                  ? FormatByteSize(spec.memory_per_proc_bytes())
                                                  : std::string("none"),
                                              ", max pids ",
                                              spec.max_pids() > 0 ? absl::StrCat(spec.max_pids())
                                                                  : std::string("none"))});
    }
    rows.push_back({"Idempotency key:", OrDash(spec.idempotency_key())});
  }
  RenderRows(rows, out);
  if (detail) {
    out << "Events:\n";
    std::vector<std::vector<std::string>> events = {{"  TIME", "FROM", "TO", "GEN", "REASON"}};
    for (const auto& event : job.events()) {
      events.push_back(
          {absl::StrCat("  ", TimeToJson(event.time_unix_ms()).is_null()
                                  ? std::string("-")
                                  : TimeToJson(event.time_unix_ms()).get<std::string>()),
           JobStateName(event.from()), JobStateName(event.to()), absl::StrCat(event.generation()),
           OrDash(event.reason())});
    }
    if (job.events().empty()) events.push_back({"  (none)"});
    RenderRows(events, out);
    if (job.resizes_size() > 0) {
      out << "Resizes:\n";
      std::vector<std::vector<std::string>> resizes = {{"  TIME", "GEN", "NODES", "REASON"}};
      for (const auto& resize : job.resizes()) {
        const nlohmann::json time = TimeToJson(resize.time_unix_ms());
        resizes.push_back(
            {absl::StrCat("  ", time.is_null() ? std::string("-") : time.get<std::string>()),
             absl::StrCat(resize.generation()),
             absl::StrCat(resize.from_nodes(), " -> ", resize.to_nodes()),
             OrDash(resize.reason())});
      }
      RenderRows(resizes, out);
    }
    if (job.membership_size() > 0) {
      out << "Membership:\n";
      std::vector<std::vector<std::string>> changes = {
          {"  TIME", "EPOCH", "RANK", "CHANGE", "DETAIL"}};
      for (const auto& change : job.membership()) {
        const nlohmann::json time = TimeToJson(change.time_unix_ms());
        // A lost rank says why; a returned one, which process it is now.
        const std::string cell = change.kind() == mesh::v1::MembershipChange::KIND_RETURNED
                                     ? absl::StrCat("incarnation ", change.incarnation())
                                     : OrDash(change.reason());
        changes.push_back(
            {absl::StrCat("  ", time.is_null() ? std::string("-") : time.get<std::string>()),
             absl::StrCat(change.epoch()), absl::StrCat(change.rank()),
             MembershipKindName(change.kind()), cell});
      }
      RenderRows(changes, out);
    }
  }
}

}  // namespace

void RenderJob(const Job& job, bool detail, OutputFormat format, std::ostream& out) {
  if (format == OutputFormat::kTable) {
    RenderJobTable(job, detail, out);
  } else {
    Render(JobToJson(job, detail), format, out);
  }
}

int RunList(const JobCommandContext& context, const Options& o, std::ostream& out,
            std::ostream& err) {
  mesh::v1::ListJobsRequest request;
  for (const std::string& text : o.states) {
    for (absl::string_view one : absl::StrSplit(text, ',')) {
      auto state = ParseJobState(one);
      if (!state) {
        return UsageError("list",
                          absl::StrCat("--state: unknown state \"", one,
                                       "\"; expected PENDING, SCHEDULED, RUNNING, RESTARTING, "
                                       "SUCCEEDED, FAILED or CANCELLED"),
                          err);
      }
      request.add_states(*state);
    }
  }
  for (const std::string& label : o.label_filters) {
    auto kv = ParseKeyValue(label);
    if (!kv.ok()) return UsageError("list", absl::StrCat("-l: ", kv.status().message()), err);
    (*request.mutable_labels())[kv->first] = kv->second;
  }
  request.set_page_size(o.limit);
  request.set_page_token(o.page_token);
  JobClient client(context.Channel());
  std::vector<Job> jobs;
  std::string next;
  for (;;) {
    auto page = client.ListJobs(request, context.timeout);
    if (!page.ok()) return ReportError(context, page.status(), err);
    for (auto& job : *page->mutable_jobs()) jobs.push_back(std::move(job));
    next = page->next_page_token();
    // A server that hands back the token it was given would loop forever.
    if (!o.all_pages || next.empty() || next == request.page_token()) break;
    request.set_page_token(next);
  }
  if (o.all_pages) next.clear();
  if (context.format != OutputFormat::kTable) {
    nlohmann::json array = nlohmann::json::array();
    for (const Job& job : jobs) array.push_back(JobToJson(job, false));
    Render({{"jobs", std::move(array)}, {"next_page_token", next}}, context.format, out);
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows = {
      {"ID", "NAME", "STATE", "GEN", "RESTARTS", "NODES", "AGE"}};
  for (const Job& job : jobs) {
    rows.push_back({job.id(), OrDash(job.spec().name()), JobStateName(job.state()),
                    absl::StrCat(job.generation()),
                    absl::StrCat(job.restarts(), "/", job.spec().max_restarts()),
                    ShowNodes(job.nodes()), Age(job.create_time_unix_ms(), now)});
  }
  if (jobs.empty()) {
    err << "meshctl: no jobs\n";
  } else {
    RenderRows(rows, out);
  }
  if (!next.empty()) {
    err << "meshctl: more jobs: use --all, or --page-token " << next << "\n";
  }
  return kExitOk;
}

int RunShow(const JobCommandContext& context, const Options& o, bool detail, std::ostream& out,
            std::ostream& err) {
  JobClient client(context.Channel());
  auto job = client.GetJob(o.job_id, context.timeout);
  if (!job.ok()) return ReportError(context, job.status(), err);
  RenderJob(*job, detail, context.format, out);
  return kExitOk;
}

int RunNodes(const JobCommandContext& context, std::ostream& out, std::ostream& err) {
  JobClient client(context.Channel());
  auto nodes = client.ListNodes(context.timeout);
  if (!nodes.ok()) return ReportError(context, nodes.status(), err);
  if (context.format != OutputFormat::kTable) {
    nlohmann::json array = nlohmann::json::array();
    for (const auto& node : nodes->nodes()) array.push_back(NodeToJson(node));
    Render({{"nodes", std::move(array)}}, context.format, out);
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATE", "ADDRESS", "SLOTS", "FREE", "GPUS", "JOBS", "ISOLATION", "LAST-SEEN"}};
  // Nodes that run every job's workers as one account: said below the table.
  std::vector<std::string> unisolated;
  for (const auto& node : nodes->nodes()) {
    rows.push_back({node.name(), NodeStateName(node.state()), OrDash(node.address()),
                    absl::StrCat(node.slots()), absl::StrCat(node.free_slots()),
                    absl::StrCat(node.free_gpus(), "/", node.gpus_size()),
                    OrDash(absl::StrJoin(node.jobs(), ",")), IsolationCell(node.isolation()),
                    node.last_seen_unix_ms() == 0
                        ? std::string("-")
                        : absl::StrCat(Age(node.last_seen_unix_ms(), now), " ago")});
    if (node.has_isolation() && !node.isolation().run_as_owner()) {
      unisolated.push_back(absl::StrCat("meshctl: node ", node.name(), ": job isolation is ",
                                        node.isolation().users()));
    }
  }
  if (nodes->nodes().empty()) {
    err << "meshctl: no nodes registered\n";
  } else {
    RenderRows(rows, out);
    for (const std::string& line : unisolated) err << line << "\n";
  }
  return kExitOk;
}

}  // namespace mesh::cli
