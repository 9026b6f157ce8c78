import { Counter, Gauge, type Registry } from 'prom-client';

/** The `nfs` collector's series, registered once; every read rewrites them from the kernel's values. */
export class NfsMetrics {
  readonly info;
  readonly age;
  readonly readBytes;
  readonly writeBytes;
  readonly serverReadBytes;
  readonly serverWriteBytes;
  readonly events;
  readonly operations;
  readonly transmissions;
  readonly majorTimeouts;
  readonly sentBytes;
  readonly receivedBytes;
  readonly queueSeconds;
  readonly rttSeconds;
  readonly executeSeconds;
  readonly errors;
  readonly transportSends;
  readonly transportReceives;
  readonly transportBadXids;
  readonly transportConnects;
  readonly transportOutstanding;
  readonly transportBacklog;
  readonly transportSending;
  readonly transportPending;
  readonly transportMaxSlots;
  readonly slotUtilization;
  readonly backlogAverage;
  private readonly all: readonly (Counter<string> | Gauge<string>)[];

  constructor(registry: Registry) {
    const registers = [registry];
    const gauge = <L extends string>(name: string, help: string, labelNames: readonly L[]): Gauge<L> => new Gauge<L>({ name, help, labelNames, registers });
    const counter = <L extends string>(name: string, help: string, labelNames: readonly L[]): Counter<L> =>
      new Counter<L>({ name, help, labelNames, registers });
    const mount = ['mount'] as const;
    const op = ['mount', 'operation'] as const;
    const transport = ['mount', 'transport'] as const;
    this.info = gauge('steadfast_nfs_mount_info', 'NFS mount identity; always 1. Maps the mount label of the other series to the export and mount point.', [
      'mount',
      'export',
      'mountpoint',
      'fstype',
      'version',
      'protocol',
      'statvers',
    ]);
    this.age = gauge('steadfast_nfs_age_seconds', 'Time since the NFS mount was made.', mount);
    this.readBytes = counter('steadfast_nfs_read_bytes_total', 'Bytes applications read from the mount, through the page cache and with O_DIRECT.', mount);
    this.writeBytes = counter('steadfast_nfs_write_bytes_total', 'Bytes applications wrote to the mount, through the page cache and with O_DIRECT.', mount);
    this.serverReadBytes = counter('steadfast_nfs_server_read_bytes_total', 'Bytes of READ payload received from the server.', mount);
    this.serverWriteBytes = counter('steadfast_nfs_server_write_bytes_total', 'Bytes of WRITE payload sent to the server.', mount);
    this.events = counter(
      'steadfast_nfs_events_total',
      'NFS client events (cache revalidations, fsyncs, congestion waits, server delays, short reads and writes).',
      ['mount', 'event'],
    );
    this.operations = counter('steadfast_nfs_operations_total', 'RPC operations completed, by operation.', op);
    this.transmissions = counter('steadfast_nfs_transmissions_total', 'RPC transmissions, retransmissions included, by operation.', op);
    this.majorTimeouts = counter('steadfast_nfs_major_timeouts_total', 'RPC major timeouts, by operation.', op);
    this.sentBytes = counter('steadfast_nfs_sent_bytes_total', 'Bytes sent for the operation, RPC headers included.', op);
    this.receivedBytes = counter('steadfast_nfs_received_bytes_total', 'Bytes received for the operation, RPC headers included.', op);
    this.queueSeconds = counter('steadfast_nfs_queue_seconds_total', 'Time requests waited in the client before being sent, by operation.', op);
    this.rttSeconds = counter('steadfast_nfs_rtt_seconds_total', 'Time from sending a request to receiving its reply, by operation.', op);
    this.executeSeconds = counter('steadfast_nfs_execute_seconds_total', 'Time from queueing a request to its completion, by operation.', op);
    this.errors = counter('steadfast_nfs_errors_total', 'Operations that completed with an error (kernel 5.6 and later), by operation.', op);
    this.transportSends = counter('steadfast_nfs_transport_sends_total', 'RPC requests sent on the transport.', transport);
    this.transportReceives = counter('steadfast_nfs_transport_receives_total', 'RPC replies received on the transport.', transport);
    this.transportBadXids = counter('steadfast_nfs_transport_bad_xids_total', 'Replies whose transaction id matched no request.', transport);
    this.transportConnects = counter('steadfast_nfs_transport_connects_total', 'Connections made by the transport (tcp, rdma).', transport);
    this.transportOutstanding = counter(
      'steadfast_nfs_transport_outstanding_requests_total',
      'Sum, over sends, of the requests on the wire at the send; divided by sends, the mean requests in flight.',
      transport,
    );
    this.transportBacklog = counter(
      'steadfast_nfs_transport_backlog_queue_total',
      'Sum, over sends, of the requests waiting for a free slot at the send.',
      transport,
    );
    this.transportSending = counter(
      'steadfast_nfs_transport_sending_queue_total',
      'Sum, over sends, of the requests waiting to transmit at the send.',
      transport,
    );
    this.transportPending = counter(
      'steadfast_nfs_transport_pending_queue_total',
      'Sum, over sends, of the requests waiting for a reply at the send.',
      transport,
    );
    this.transportMaxSlots = gauge('steadfast_nfs_transport_max_slots', 'Most RPC request slots the transport ever had allocated.', transport);
    this.slotUtilization = gauge(
      'steadfast_nfs_rpc_slot_utilization_ratio',
      'Mean requests in flight at a send over the RPC slots of the mount, over all its transports, since the previous scrape.',
      mount,
    );
    this.backlogAverage = gauge(
      'steadfast_nfs_rpc_backlog_average',
      'Mean requests waiting for an RPC slot at a send, summed over the transports of the mount, since the previous scrape.',
      mount,
    );
    this.all = [
      this.info,
      this.age,
      this.readBytes,
      this.writeBytes,
      this.serverReadBytes,
      this.serverWriteBytes,
      this.events,
      this.operations,
      this.transmissions,
      this.majorTimeouts,
      this.sentBytes,
      this.receivedBytes,
      this.queueSeconds,
      this.rttSeconds,
      this.executeSeconds,
      this.errors,
      this.transportSends,
      this.transportReceives,
      this.transportBadXids,
      this.transportConnects,
      this.transportOutstanding,
      this.transportBacklog,
      this.transportSending,
      this.transportPending,
      this.transportMaxSlots,
      this.slotUtilization,
      this.backlogAverage,
    ];
  }

  /** Forgets every series; the next read writes what is there now (mounts come and go). */
  reset(): void {
    for (const metric of this.all) metric.reset();
  }
}
