import { describe, expect, it } from 'vitest';
import { parseDcgmExporterText, type DcgmGpuSample } from '../../../agent/sources/dcgm-exporter.js';
import { parseExpositionText } from '../../../agent/sources/exposition-text.js';
import { DCGM_SCRAPES, dcgmScrape } from '../helpers.js';

const MiB = 1024 ** 2;
const MHz = 1e6;

function onlyGpu(name: string): DcgmGpuSample {
  const report = parseDcgmExporterText(dcgmScrape(name));
  expect(report.gpus).toHaveLength(1);
  return report.gpus[0] as DcgmGpuSample;
}

describe('dcgm-exporter samples', () => {
  it('finds the six captured scrapes the README lists', () => {
    expect(DCGM_SCRAPES).toHaveLength(6);
  });

  it.each(DCGM_SCRAPES)('parses every line of %s', (name) => {
    const parsed = parseExpositionText(dcgmScrape(name));
    expect(parsed.errors).toEqual([]);
    expect(parsed.samples.length).toBeGreaterThan(0);
  });

  it('maps the L4 full scrape onto the same fields nvidia-smi gives, in base units', () => {
    expect(onlyGpu('kops_L4_580.105.08_full-scrape.prom')).toEqual({
      index: 0,
      pciBusId: '0000:31:00',
      uuid: 'GPU-c2f76b33-7953-256e-8f33-1343419b1a1c',
      productName: 'NVIDIA L4',
      driverVersion: '580.105.08',
      temperatureCelsius: 31,
      // The L4 has no memory temperature sensor: DCGM reads 0, which is no reading.
      memoryTemperatureCelsius: undefined,
      powerDrawWatts: 16.365,
      powerLimitWatts: undefined,
      utilizationRatio: 0,
      memoryUsedBytes: 0,
      memoryTotalBytes: (0 + 22563 + 470) * MiB,
      ecc: [],
      remappedRows: { correctable: 0, uncorrectable: 0, pending: undefined, failure: false },
      retiredPages: undefined,
      pcieLinkGeneration: undefined,
      pcieLinkWidth: undefined,
      pcieReplayErrors: 0,
      clocks: { sm: 210 * MHz, memory: 405 * MHz, video: undefined },
      maxClocks: undefined,
      throttleReasons: undefined,
      lastXid: undefined,
    });
  });

  it('maps the L40S scrape, adding the reserved frame buffer to the total', () => {
    expect(onlyGpu('upcloud_L40S_595.58.03_scrape.prom')).toMatchObject({
      pciBusId: '0000:00:07',
      productName: 'NVIDIA L40S',
      driverVersion: '595.58.03',
      temperatureCelsius: 32,
      memoryTemperatureCelsius: undefined,
      powerDrawWatts: 35.686,
      memoryUsedBytes: 0,
      memoryTotalBytes: (0 + 45459 + 608) * MiB,
      remappedRows: { correctable: 0, uncorrectable: 0, failure: false },
      clocks: { sm: 210 * MHz, memory: 405 * MHz },
    });
  });

  it('maps the T4 under load: utilisation as a ratio, clocks in Hz, and no HELP lines needed', () => {
    expect(onlyGpu('ericsson_T4_590.48.01_no-help-lines.prom')).toMatchObject({
      pciBusId: '0000:37:00',
      uuid: 'GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a',
      productName: 'Tesla T4',
      temperatureCelsius: 74,
      powerDrawWatts: 68.244,
      utilizationRatio: 0.91,
      memoryUsedBytes: 5120 * MiB,
      memoryTotalBytes: (5120 + 9791 + 447) * MiB,
      pcieReplayErrors: 0,
      clocks: { sm: 660 * MHz, memory: 5000 * MHz },
      // The T4 scrape has no remapped-row fields at all (pre-Ampere): absent, not zero.
      remappedRows: undefined,
    });
  });

  it.each([
    ['vks_GRID-A100-10C-vGPU_580.126.09_scrape.prom', 'GRID A100-10C', 9323 + 916],
    ['vks_GRID-A100-40C-vGPU_580.126.09_scrape.prom', 'GRID A100-40C', 37739 + 3220],
  ])('maps the vGPU scrape %s, which has no temperature or power fields, to no such readings', (name, model, totalMiB) => {
    expect(onlyGpu(name)).toMatchObject({
      pciBusId: '0000:03:00',
      productName: model,
      driverVersion: '580.126.09',
      temperatureCelsius: undefined,
      memoryTemperatureCelsius: undefined,
      powerDrawWatts: undefined,
      utilizationRatio: 0,
      memoryUsedBytes: 0,
      memoryTotalBytes: totalMiB * MiB,
      clocks: { sm: 1410 * MHz, memory: 1215 * MHz },
    });
  });

  it('places the GB200 GPUs by their non-zero PCI domains, and the GPUs of scrapes without pci_bus_id by UUID', () => {
    const report = parseDcgmExporterText(dcgmScrape('dcgm_excerpts_from_public_issues.prom'));
    const placed = report.gpus.map((gpu) => [gpu.index, gpu.pciBusId, gpu.uuid]);
    expect(placed.filter(([, pci]) => pci !== undefined)).toEqual([
      [0, '0008:01:00', 'GPU-2e2b6342-3996-51b9-5480-e20df571e09c'],
      [1, '0009:01:00', 'GPU-67ff7ed1-19b8-1998-84ef-59fc0cbb0f3e'],
      [2, '0018:01:00', 'GPU-c0c859b5-876c-b6f1-c6d7-bde487c326a1'],
      [3, '0019:01:00', 'GPU-5679a9d0-6f32-6a97-ff37-fce5fd1a2ac9'],
    ]);
    // V100, A30 MIG, A800 and T400 excerpts predate the pci_bus_id label: one GPU per UUID, the
    // A30's three MIG instances of one GPU included.
    const byUuid = placed.filter(([, pci]) => pci === undefined);
    expect(byUuid).toHaveLength(11);
    expect(new Set(byUuid.map(([, , uuid]) => uuid)).size).toBe(11);
    expect(byUuid).toContainEqual([2, undefined, 'GPU-3f61f0fb-57f5-fd80-ebb6-54347a8178dd']);
    expect(report.unidentifiedSeries).toBe(0);
  });
});

describe('dcgm field mapping', () => {
  const gpu = (series: string): string => `gpu="2",UUID="GPU-x",pci_bus_id="00000000:3B:00.0",modelName="NVIDIA H100 80GB HBM3"${series}`;

  it('maps ECC totals, retired pages, row remap state, PCIe link, power limit, max clocks, throttle bitmask and the last Xid', () => {
    const lines = [
      ['DCGM_FI_DEV_ECC_SBE_VOL_TOTAL', 5],
      ['DCGM_FI_DEV_ECC_DBE_VOL_TOTAL', 1],
      ['DCGM_FI_DEV_ECC_SBE_AGG_TOTAL', 50],
      ['DCGM_FI_DEV_ECC_DBE_AGG_TOTAL', 2],
      ['DCGM_FI_DEV_RETIRED_SBE', 3],
      ['DCGM_FI_DEV_RETIRED_DBE', 4],
      ['DCGM_FI_DEV_RETIRED_PENDING', 2],
      ['DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS', 7],
      ['DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS', 1],
      ['DCGM_FI_DEV_ROW_REMAP_PENDING', 1],
      ['DCGM_FI_DEV_ROW_REMAP_FAILURE', 0],
      ['DCGM_FI_DEV_PCIE_LINK_GEN', 5],
      ['DCGM_FI_DEV_PCIE_LINK_WIDTH', 16],
      ['DCGM_FI_DEV_POWER_MGMT_LIMIT', 700],
      ['DCGM_FI_DEV_MAX_SM_CLOCK', 1980],
      ['DCGM_FI_DEV_MAX_MEM_CLOCK', 2619],
      ['DCGM_FI_DEV_VIDEO_CLOCK', 1755],
      // sw_power_cap (0x4) | sw_thermal_slowdown (0x20)
      ['DCGM_FI_DEV_CLOCK_THROTTLE_REASONS', 0x24],
      ['DCGM_FI_DEV_XID_ERRORS', 79],
      ['DCGM_FI_DEV_MEMORY_TEMP', 41],
      ['DCGM_FI_DEV_FB_TOTAL', 81559],
      ['DCGM_FI_DEV_FB_USED', 100],
      ['DCGM_FI_DEV_FB_FREE', 80000],
    ] as const;
    const report = parseDcgmExporterText(lines.map(([field, value]) => `${field}{${gpu('')}} ${value}`).join('\n'));
    expect(report.gpus[0]).toMatchObject({
      index: 2,
      pciBusId: '0000:3b:00',
      ecc: [
        { scope: 'volatile', type: 'correctable', location: 'total', count: 5 },
        { scope: 'volatile', type: 'uncorrectable', location: 'total', count: 1 },
        { scope: 'aggregate', type: 'correctable', location: 'total', count: 50 },
        { scope: 'aggregate', type: 'uncorrectable', location: 'total', count: 2 },
      ],
      retiredPages: { singleBit: 3, doubleBit: 4, pending: true },
      remappedRows: { correctable: 7, uncorrectable: 1, pending: true, failure: false },
      pcieLinkGeneration: 5,
      pcieLinkWidth: 16,
      powerLimitWatts: 700,
      memoryTemperatureCelsius: 41,
      // DCGM_FI_DEV_FB_TOTAL, when exported, wins over used + free.
      memoryTotalBytes: 81559 * MiB,
      clocks: { video: 1755 * MHz },
      maxClocks: { sm: 1980 * MHz, memory: 2619 * MHz },
      throttleReasons: {
        gpu_idle: false,
        applications_clocks_setting: false,
        sw_power_cap: true,
        hw_slowdown: false,
        sync_boost: false,
        sw_thermal_slowdown: true,
        hw_thermal_slowdown: false,
        hw_power_brake_slowdown: false,
        display_clocks_setting: false,
      },
      lastXid: 79,
    });
  });

  it('treats DCGM blank sentinels and negative or non-finite values as no reading', () => {
    const report = parseDcgmExporterText(
      [
        `DCGM_FI_DEV_MEMORY_TEMP{${gpu('')}} 9223372036854775794`,
        `DCGM_FI_DEV_POWER_USAGE{${gpu('')}} 140737488355330.000000`,
        `DCGM_FI_DEV_GPU_TEMP{${gpu('')}} NaN`,
        `DCGM_FI_DEV_GPU_UTIL{${gpu('')}} -1`,
      ].join('\n'),
    );
    expect(report.gpus[0]).toMatchObject({
      memoryTemperatureCelsius: undefined,
      powerDrawWatts: undefined,
      temperatureCelsius: undefined,
      utilizationRatio: undefined,
    });
  });

  it('under MIG takes device-wide fields from any GPU-instance series but the frame buffer only from the whole GPU', () => {
    const report = parseDcgmExporterText(
      [
        `DCGM_FI_DEV_SM_CLOCK{${gpu(',GPU_I_PROFILE="2g.20gb",GPU_I_ID="3"')}} 1410`,
        `DCGM_FI_DEV_SM_CLOCK{${gpu(',GPU_I_PROFILE="2g.20gb",GPU_I_ID="5"')}} 1410`,
        `DCGM_FI_DEV_FB_USED{${gpu(',GPU_I_PROFILE="2g.20gb",GPU_I_ID="3"')}} 1000`,
        `DCGM_FI_DEV_FB_FREE{${gpu(',GPU_I_PROFILE="2g.20gb",GPU_I_ID="3"')}} 19000`,
      ].join('\n'),
    );
    expect(report.gpus).toHaveLength(1);
    expect(report.gpus[0]).toMatchObject({ clocks: { sm: 1410 * MHz }, memoryUsedBytes: undefined, memoryTotalBytes: undefined });
  });

  it('leaves out series that are not per GPU (no gpu label), such as NVSwitch and CPU families', () => {
    const report = parseDcgmExporterText('DCGM_FI_DEV_NVSWITCH_TEMPERATURE_CURRENT{nvswitch="0"} 40\nDCGM_FI_DEV_CPU_TEMP_CURRENT{cpu="0"} 50\n');
    expect(report).toMatchObject({ gpus: [], unidentifiedSeries: 0 });
  });
});
