import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { agentTokenFor } from '../core/credentials.js';

/**
 * One credential per role for a simulated installation, each in its own file under `dir` as an
 * operator would provision them: the controller's `controller.auth` names the files, Alertmanager
 * gets its own token file, each agent a token bound to its node.
 */
export class SimCredentials {
  readonly operator = randomBytes(24).toString('hex');
  readonly readOnly = randomBytes(24).toString('hex');
  readonly alertmanager = randomBytes(24).toString('hex');
  private readonly agentSecret = randomBytes(32).toString('hex');
  /** The controller's agents.secretFile: each agent's web token (its POST endpoints) derives from it. */
  private readonly agentWebSecret = randomBytes(32).toString('hex');
  readonly operatorTokenFile: string;
  readonly readOnlyTokenFile: string;
  readonly alertmanagerTokenFile: string;
  readonly agentSecretFile: string;
  readonly agentWebSecretFile: string;

  constructor(private readonly dir: string) {
    this.operatorTokenFile = this.write('operator-token', this.operator);
    this.readOnlyTokenFile = this.write('read-only-token', this.readOnly);
    this.alertmanagerTokenFile = this.write('alertmanager-token', this.alertmanager);
    this.agentSecretFile = this.write('agent-secret', this.agentSecret);
    this.agentWebSecretFile = this.write('agent-web-secret', this.agentWebSecret);
  }

  /** `controller.auth` for these files. */
  get auth(): { operatorTokenFile: string; readOnlyTokenFile: string; alertmanagerTokenFile: string; agentSecretFile: string } {
    return {
      operatorTokenFile: this.operatorTokenFile,
      readOnlyTokenFile: this.readOnlyTokenFile,
      alertmanagerTokenFile: this.alertmanagerTokenFile,
      agentSecretFile: this.agentSecretFile,
    };
  }

  /** `node`'s agent token (what `steadfast token agent --node NODE` prints). */
  agentToken(node: string): string {
    return agentTokenFor(this.agentSecret, node);
  }

  /** Writes `node`'s agent token to its own file (as provisioning puts it on the node); returns the path. */
  agentTokenFile(node: string): string {
    return this.write(`agent-token-${node}`, this.agentToken(node));
  }

  /** Writes the token `node`'s agent requires on its own POST endpoints (its --web.token-file); returns the path. */
  agentWebTokenFile(node: string): string {
    return this.write(`agent-web-token-${node}`, agentTokenFor(this.agentWebSecret, node));
  }

  private write(name: string, secret: string): string {
    const path = join(this.dir, name);
    writeFileSync(path, `${secret}\n`, { mode: 0o600 });
    return path;
  }
}
