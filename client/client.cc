// libkvtier's C++ API (client/client.h): Client, which connects, opens the
// session, attaches namespaces (mapping and registering their banks) and
// drops them.
//
// Thread-safety: thread-safe; the Connection it owns is.
#include "client/client.h"

#include <unistd.h>

#include <memory>
#include <thread>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/bank_mapping.h"
#include "client/connection.h"
#include "client/cuda_host.h"
#include "client/namespace_state.h"
#include "client/outage.h"
#include "common/default_socket.h"
#include "shm/trusted_path.h"

namespace kvtier::client {

Client::Client(std::shared_ptr<Connection> connection)
    : connection_(std::move(connection)) {}

Client::~Client() = default;

uint64_t Client::session_id() const { return connection_->session_id.load(); }
const std::string& Client::socket() const { return connection_->socket; }
bool Client::session_alive() const { return connection_->alive.load(); }
bool Client::fast_lookup_active() const {
  return connection_->fast_lookup && connection_->link.active();
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ConnectOptions& options) {
  auto conn = std::make_shared<Connection>();
  conn->socket = ResolveClientSocket(options.socket);
  conn->engine_socket = conn->socket + ".lookup";
  conn->timeout = options.timeout;
  conn->client_name = options.client_name;
  if (!options.instance_id.empty() && options.instance_id.size() != 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("instance_id: must be empty or 16 bytes, got ",
                     options.instance_id.size()));
  }
  conn->instance_id = options.instance_id;
  {
    absl::BitGen gen;
    do {
      conn->connection_id = absl::Uniform<uint64_t>(gen);
    } while (conn->connection_id == 0);
  }
  if (conn->instance_id.empty()) {
    absl::BitGen gen;
    conn->instance_id.resize(16);
    for (char& c : conn->instance_id) {
      c = static_cast<char>(absl::Uniform<uint8_t>(gen));
    }
  }
  conn->fast_lookup = options.fast_lookup;
  conn->reconnect = options.reconnect;
  // Waits for the daemon (its socket may not be there yet) up to the
  // timeout, as a gRPC channel's WaitForConnected did.
  auto session = conn->OpenSession(absl::Now() + options.timeout,
                                   /*wait_for_daemon=*/true);
  if (!session.ok()) return session.status();
  // Who answered: the socket's owner is the daemon, if its folder is one
  // nobody else could have put a socket in (shm/trusted_path.h); the engine
  // socket beside it must be the same uid's.
  auto daemon_uid = shm::CheckDaemonSocket(conn->socket);
  auto engine_uid = daemon_uid.ok()
                        ? shm::CheckDaemonSocket(conn->engine_socket)
                        : daemon_uid;
  if (daemon_uid.ok() && engine_uid.ok() && *engine_uid != *daemon_uid) {
    engine_uid = absl::PermissionDeniedError(absl::StrCat(
        conn->engine_socket, " is uid ", *engine_uid, "'s, but ", conn->socket,
        " is uid ", *daemon_uid, "'s: not the daemon's engine socket"));
  }
  if (!engine_uid.ok()) {
    conn->AbandonSession(session->fd);
    return engine_uid.status();
  }
  conn->daemon_uid = *daemon_uid;
  conn->session_id = session->id;
  if (absl::Status s =
          conn->link.Bind(conn->engine_socket, session->id, conn->timeout);
      !s.ok()) {
    conn->AbandonSession(session->fd);
    return s;
  }
  conn->epoch = 1;
  conn->alive = true;
  Connection* raw = conn.get();
  conn->session_thread =
      std::thread([raw, first = *std::move(session)]() mutable {
        raw->KeepSession(std::move(first));
      });
  return std::unique_ptr<Client>(new Client(std::move(conn)));
}

absl::StatusOr<std::unique_ptr<Namespace>> Client::Attach(
    const AttachOptions& options) {
  v1::AttachRequest req;
  req.set_api_version(1);
  req.set_namespace_(options.name);
  v1::Layout* l = req.mutable_layout();
  l->set_model(options.layout.model);
  l->set_tokens_per_page(options.layout.tokens_per_page);
  l->set_num_layers(options.layout.num_layers);
  for (const auto& b : options.layout.page_banks) {
    auto* pb = l->add_page_banks();
    pb->set_name(b.name);
    pb->set_row_bytes(b.row_bytes);
    pb->set_dtype(b.dtype);
  }
  l->set_snapshot_row_bytes(options.layout.snapshot_row_bytes);
  l->set_tp_size(options.layout.tp_size);
  l->set_replicated(options.layout.replicated);
  l->set_hash_kind(static_cast<v1::HashKind>(options.layout.hash_kind));
  req.set_tp_rank(options.tp_rank);
  req.mutable_capacity()->set_page_rows(options.capacity.page_rows);
  req.mutable_capacity()->set_snapshot_rows(options.capacity.snapshot_rows);
  req.mutable_capacity()->set_max_replay_tokens(
      options.capacity.max_replay_tokens);
  req.set_tenant_salt(options.tenant_salt);
  // The GPU that will copy the rows, for the banks' NUMA placement.
  req.set_pci_bus_id(!options.pci_bus_id.empty()  ? options.pci_bus_id
                     : options.register_with_cuda ? CurrentDevicePciBusId()
                                                  : "");
  const v1::AttachRequest replay = req;  // Without a session.
  const uint64_t epoch = connection_->epoch.load();
  if (!connection_->alive.load()) return Unreachable("Attach");
  req.set_session_id(connection_->session_id.load());
  if (!connection_->alive.load() || connection_->epoch.load() != epoch) {
    return Unreachable("Attach");
  }
  v1::AttachResponse resp;
  if (absl::Status s = connection_->CallAttach(req, &resp); !s.ok()) return s;

  auto state = std::make_shared<NamespaceState>();
  state->conn = connection_;
  state->id = resp.namespace_id();
  state->epoch = epoch;
  state->attach_request = replay;
  state->name = options.name;
  state->layout = options.layout;
  state->tp_rank = options.tp_rank;
  state->created = resp.created();
  state->device_epoch = epoch;
  state->acl_entry = resp.acl_entry();
  for (const auto& p : resp.device_pools()) {
    DevicePoolInfo info;
    info.device_ordinal = p.device_ordinal();
    info.pci_bus_id = p.pci_bus_id();
    info.ipc_handle = p.ipc_handle();
    info.rows = p.rows();
    info.row_bytes = p.row_bytes();
    info.row_stride = p.row_stride();
    info.withheld = p.withheld();
    state->device_pools.push_back(std::move(info));
  }
  auto hasher = BlockHasher::Create(options.layout.hash_kind, resp.hash_seed(),
                                    options.layout.tokens_per_page);
  if (!hasher.ok()) return hasher.status();
  state->hasher.emplace(*std::move(hasher));

  const absl::Time map_start = absl::Now();
  auto banks = MappedBanks::Map(BankSegments(resp), connection_->daemon_uid);
  if (!banks.ok()) return banks.status();
  state->banks = *std::move(banks);
  state->map_seconds = absl::ToDoubleSeconds(absl::Now() - map_start);
  if (options.register_with_cuda && CudaDevicePresent()) {
    const absl::Time reg_start = absl::Now();
    if (absl::Status s = state->banks->RegisterWithCuda(); !s.ok()) return s;
    state->register_seconds = absl::ToDoubleSeconds(absl::Now() - reg_start);
  }
  {
    absl::MutexLock lock(&connection_->mu);
    connection_->namespaces.push_back(state);
  }
  // A session that ended during the attach may have been replaced without
  // this namespace: its id would be the dead session's.
  if (!state->Current(epoch)) return Unreachable("Attach");
  return std::unique_ptr<Namespace>(new Namespace(std::move(state)));
}

absl::StatusOr<DropResult> Client::Drop(const std::string& name,
                                        std::string_view hash, bool force) {
  if (!connection_->alive.load()) return Unreachable("Drop");
  v1::DropRequest req;
  req.set_api_version(1);
  req.set_namespace_(name);
  req.set_hash(std::string(hash));
  req.set_force(force);
  // The session's bound credentials carry the right to drop namespaces
  // under --namespace_acl (docs/operations.md, "Security model").
  req.set_session_id(connection_->session_id.load());
  v1::DropResponse resp;
  if (absl::Status s =
          connection_->Call(fastpath::Method::kDrop, "Drop", req, &resp);
      !s.ok()) {
    return s;
  }
  return DropResult{resp.dropped_pages(), resp.dropped_snapshots()};
}

}  // namespace kvtier::client
