import { afterEach, describe, expect, it } from 'vitest';
import type { AuditEntry } from '../../core/audit.js';
import type { Controller } from '../../controller/service.js';
import { jobMembers } from '../../controller/job-store.js';
import { DryRunBackend } from '../../actuators/dry-run.js';
import { agentToken, post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { LLAMA as JOB } from '../support/steps.js';
import { until } from '../support/until.js';

/**
 * An eviction with no warm standby left (ByteRobust §6.2): the node was drained, yet it stayed in
 * the job's membership and in the node list of the relaunch that followed, so the job was
 * relaunched onto a node taken out of service. Now the node leaves the job, the relaunch does
 * not happen, and the job waits for a person, paged once.
 */

const summaries = (entries: AuditEntry[]): string[] => entries.map((entry) => `${entry.type}: ${entry.summary}`);

describe('an eviction with no standby left, on the real controller', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const controllers: Controller[] = [];
  afterEach(async () => {
    await Promise.all(controllers.splice(0).map((controller) => controller.close()));
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  it('drains the node, takes it out of the job, relaunches nothing and hands the job to a person', async () => {
    const store = testRedis();
    stores.push(store);
    const { controller, url, metricsUrl } = await startController(testConfig(store.url, store.prefix));
    controllers.push(controller);
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    expect(await controller.backend.standbys()).toEqual([]);

    await post(`${url}/api/v1/signals`, {
      kind: 'xid',
      node: 'n01',
      gpu: '0000:18:00',
      xid: 79,
      message: 'GPU has fallen off the bus.',
      time: new Date().toISOString(),
    });
    const job = await until(
      'the job handed to a person',
      () => controller.jobs.get('llama'),
      (record) => record.state === 'waiting_for_human',
    );
    expect(Object.keys(await new DryRunBackend(store.redis, store.keys).recorded())).toEqual(['n01']);

    // n01 no longer belongs to the job: not a member, not the job of its node, not an agent of the job.
    expect(job.vacant).toEqual(['n01']);
    expect(jobMembers(job)).toEqual(['n00', 'n02', 'n03']);
    expect(await controller.jobs.jobOnNode('n01')).toBeUndefined();
    expect(await controller.jobs.jobOnNode('n02')).toBe('llama');
    const report = await post(`${url}/api/v1/jobs/llama/checkpoints`, { step: 1, rank: 1, tier: 'host', holder: 'n01' }, agentToken('n01'));
    expect(report.status).toBe(403);

    const audit = summaries(await controller.audit.read({ limit: 200 }));
    expect(audit).toContain(
      'action: llama: evict n01: failed (no warm standby left to replace n01; n01 left the job, which waits for a person (provision a standby: steadfast plan standby sizes the pool))',
    );
    // The relaunch was decided with the eviction, and did not run.
    expect(audit.some((line) => line.startsWith('decision: llama: restart'))).toBe(true);
    expect(audit.filter((line) => /^action: llama: restart/.test(line))).toEqual([]);
    const paged = await until(
      'the page on record',
      () => controller.audit.read({ limit: 200 }),
      (entries) => summaries(entries).some((line) => line.startsWith('action: llama: page_human')),
    );
    expect(summaries(paged).find((line) => line.startsWith('decision: llama: page_human'))).toMatch(
      /no warm standby left to replace n01: it has left the job, which is not relaunched without it/,
    );
    const metrics = await until(
      'the page counted',
      async () => (await fetch(`${metricsUrl}/metrics`)).text(),
      (text) => /steadfast_human_pages_total\{training_job="llama"\} \d/.test(text),
    );
    expect(metrics).toMatch(/steadfast_human_pages_total\{training_job="llama"\} 1$/m);
  });

  it('leaves a dry-run job its node and describes its relaunch, as a dry-run job takes no standby', async () => {
    const store = testRedis();
    stores.push(store);
    const { controller, url } = await startController(testConfig(store.url, store.prefix));
    controllers.push(controller);
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    await controller.jobs.setPolicy('llama', { dryRun: true });
    await post(`${url}/api/v1/signals`, {
      kind: 'xid',
      node: 'n01',
      gpu: '0000:18:00',
      xid: 79,
      message: 'GPU has fallen off the bus.',
      time: new Date().toISOString(),
    });
    const entries = await until(
      'the described relaunch',
      () => controller.audit.read({ limit: 200 }),
      (list) => summaries(list).some((line) => /^action: llama: restart: done \(dry-run: would run/.test(line)),
    );
    expect(summaries(entries)).toContain(
      'action: llama: evict n01: failed (no warm standby left to replace n01; provision one (steadfast plan standby sizes the pool))',
    );
    const job = await controller.jobs.get('llama');
    expect(job.vacant).toEqual([]);
    expect(await controller.jobs.jobOnNode('n01')).toBe('llama');
  });
});
