"""Tests of the burn (steadfast_burn.py) on the CPU: a device that computes wrong fails, a right one
passes with its throughput, and the command prints the one JSON line the agent reads.

Run alone: /usr/bin/python3 -m unittest discover -s clients/python/tests -p 'test_steadfast_burn.py' -v
"""

import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "steadfast_burn.py")
sys.path.insert(0, os.path.join(HERE, ".."))

import steadfast_burn  # noqa: E402


class ReferenceComparison(unittest.TestCase):
    def test_a_device_that_computes_right_passes_with_its_throughput(self) -> None:
        result = steadfast_burn.run_burn(["cpu"], seconds=0.2, size=64)
        self.assertTrue(result["ok"], result)
        [device] = result["devices"]
        self.assertEqual(device["device"], "cpu")
        self.assertTrue(device["ok"])
        self.assertLess(device["checksum_error"], steadfast_burn.DEFAULT_TOLERANCE)
        self.assertGreater(device["tflops"], 0)
        self.assertGreaterEqual(device["rounds"], 1)
        self.assertNotIn("reason", device)

    def test_a_corrupted_result_fails_the_device_and_says_which_round(self) -> None:
        def corrupt(_device: str, round_: int, result):  # one wrong element in the third round
            if round_ == 2:
                result = result.clone()
                result[3, 5] += 0.5
            return result

        result = steadfast_burn.run_burn(["cpu"], seconds=5, size=32, perturb=corrupt)
        self.assertFalse(result["ok"])
        [device] = result["devices"]
        self.assertFalse(device["ok"])
        self.assertIn("round 2", device["reason"])
        self.assertIn("CPU reference", device["reason"])
        self.assertGreater(device["checksum_error"], steadfast_burn.DEFAULT_TOLERANCE)
        # It stopped at the wrong round rather than burning on for the whole time.
        self.assertLess(device["seconds"], 5)

    def test_a_result_that_is_not_a_number_fails(self) -> None:
        def poison(_device: str, _round: int, result):
            result = result.clone()
            result[0, 0] = float("nan")
            return result

        [device] = steadfast_burn.run_burn(["cpu"], seconds=0.1, size=32, perturb=poison)["devices"]
        self.assertFalse(device["ok"])
        self.assertIsNone(device["checksum_error"])

    def test_the_checksum_moves_with_any_single_element(self) -> None:
        torch = steadfast_burn._torch()
        matrix, start = steadfast_burn.seeded_inputs(32, torch.float64)
        result = steadfast_burn.chain(matrix, start)
        changed = result.clone()
        changed[31, 15] += 1e-2
        self.assertGreater(steadfast_burn.relative_error(steadfast_burn.checksum(changed), steadfast_burn.checksum(result)), 1e-5)

    def test_the_reference_is_the_same_on_every_run(self) -> None:
        self.assertEqual(steadfast_burn.reference_checksum(), steadfast_burn.reference_checksum())


class CommandLine(unittest.TestCase):
    def run_script(self, *args: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)

    def test_it_prints_one_json_line_per_run_with_each_devices_figures_and_exits_0(self) -> None:
        done = self.run_script("--seconds", "0.5", "--size", "64")
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.strip().splitlines()
        self.assertEqual(len(lines), 1)
        report = json.loads(lines[0])
        self.assertEqual(set(report), {"ok", "seconds", "devices"})
        self.assertTrue(report["ok"])
        [device] = report["devices"]
        self.assertEqual(set(device), {"device", "name", "ok", "checksum_error", "tflops", "seconds", "rounds"})
        self.assertEqual(device["device"], "cpu")
        self.assertGreaterEqual(device["seconds"], 0.5)

    def test_a_bad_option_is_a_usage_error(self) -> None:
        done = self.run_script("--seconds", "0")
        self.assertEqual(done.returncode, 2)
        self.assertIn("--seconds", done.stderr)
        self.assertEqual(done.stdout, "")

    def test_a_device_that_does_not_exist_fails_with_its_reason(self) -> None:
        done = self.run_script("--seconds", "0.1", "--device", "nosuchdevice")
        self.assertEqual(done.returncode, 1)
        [device] = json.loads(done.stdout)["devices"]
        self.assertFalse(device["ok"])
        self.assertIn("nosuchdevice", device["reason"])


if __name__ == "__main__":
    unittest.main()
