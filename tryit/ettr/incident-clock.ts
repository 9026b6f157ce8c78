import type { Incident, IncidentSource } from './incidents.js';

const S = 1000;

/**
 * When the next incident strikes. Incidents are drawn as gaps of training time (incidents.ts), so
 * the clock runs only while the job trains: stopping the job pauses it with the rest of the gap
 * kept, and restarting the job resumes it.
 */
export class IncidentClock {
  private next: Incident;
  private uptimeLeftMs: number;
  private running: { since: number; token: number } | null = null;
  /** Tells a pause-and-resume apart from the alarm it replaced, which then stays silent. */
  private tokens = 0;

  constructor(
    private readonly source: IncidentSource,
    /** Schedules on the simulation's event queue. */
    private readonly schedule: (time: number, run: () => void) => void,
    private readonly strike: (incident: Incident) => void,
  ) {
    this.next = source.next();
    this.uptimeLeftMs = this.next.uptimeGapSeconds * S;
  }

  /** Runs the clock from `now`; a clock already running, or a source with no incidents left, stays as it is. */
  resume(now: number): void {
    if (this.running !== null || !Number.isFinite(this.uptimeLeftMs)) return;
    this.tokens += 1;
    const token = this.tokens;
    this.running = { since: now, token };
    this.schedule(now + this.uptimeLeftMs, () => {
      if (this.running?.token === token) this.fire();
    });
  }

  pause(now: number): void {
    if (this.running === null) return;
    this.uptimeLeftMs -= now - this.running.since;
    this.running = null;
  }

  private fire(): void {
    const incident = this.next;
    this.running = null;
    this.next = this.source.next();
    this.uptimeLeftMs = this.next.uptimeGapSeconds * S;
    this.strike(incident);
  }
}
