"""meshrt without a cluster: exceptions, argument checks, placements and
that the type stubs name everything the extension exports."""

import ast
import enum
import os
import time
import unittest

import meshrt
from meshrt import _meshrt


class ErrorsTest(unittest.TestCase):
    def test_hierarchy(self):
        for cls in (meshrt.JobFailedError, meshrt.TimeoutError, meshrt.NotFoundError,
                    meshrt.InvalidArgumentError, meshrt.UnavailableError):
            self.assertTrue(issubclass(cls, meshrt.Error), cls)
        self.assertTrue(issubclass(meshrt.TimeoutError, TimeoutError))
        self.assertTrue(issubclass(meshrt.InvalidArgumentError, ValueError))
        self.assertTrue(issubclass(meshrt.Error, Exception))

    def test_init_without_environment_names_the_variable(self):
        with self.assertRaises(meshrt.InvalidArgumentError) as raised:
            meshrt.init(read_env=False)
        self.assertEqual(raised.exception.code, "INVALID_ARGUMENT")
        self.assertIn("MESH_COORDINATOR", raised.exception.message)
        self.assertEqual(str(raised.exception), raised.exception.message)

    def test_init_checks_its_keywords(self):
        with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'bogus'"):
            meshrt.init(bogus=1)
        with self.assertRaisesRegex(meshrt.InvalidArgumentError, "gloo"):
            meshrt.init(backend="mpi", read_env=False)
        with self.assertRaisesRegex(TypeError, "callable"):
            meshrt.init(on_failure=3, read_env=False)
        with self.assertRaisesRegex(meshrt.InvalidArgumentError, "join_timeout"):
            meshrt.init(join_timeout=-1.0, read_env=False)

    def test_wrong_argument_types_are_type_errors(self):
        # Arguments the bindings convert themselves: TypeError naming the
        # argument, not pybind11's "RuntimeError: Unable to cast".
        for kwargs, text in ((dict(rank="x"), "rank must be int, not str"),
                             (dict(rank=1.5), "rank must be int, not float"),
                             (dict(generation="0"), "generation must be int"),
                             (dict(coordinator=5), "coordinator must be str, not int"),
                             (dict(join_timeout="abc"), "join_timeout must be a number"),
                             (dict(timeout=[1]), "timeout must be a number"),
                             (dict(backend=3), "backend must be str, not int"),
                             (dict(read_env="x"), "read_env must be bool")):
            with self.subTest(kwargs=kwargs):
                options = dict(read_env=False, **kwargs) if "read_env" not in kwargs else kwargs
                with self.assertRaisesRegex(TypeError, text):
                    meshrt.init(**options)
        with self.assertRaisesRegex(meshrt.InvalidArgumentError, "rank is out of range"):
            meshrt.init(read_env=False, rank=2**40)
        with self.assertRaisesRegex(TypeError, "timeout must be a number of seconds, not str"):
            meshrt.JobClient("127.0.0.1:1", timeout="x")
        client = meshrt.JobClient("127.0.0.1:1")
        # Checked before anything is sent.
        with self.assertRaisesRegex(TypeError, r"command\[1\] is int"):
            client.submit(["a", 1])
        with self.assertRaisesRegex(TypeError, "nodes must be an int or a"):
            client.submit(["a"], nodes="x")
        with self.assertRaisesRegex(TypeError, "on_hang must be"):
            client.submit(["a"], on_hang=2)
        with self.assertRaisesRegex(meshrt.InvalidArgumentError, "not a hang policy"):
            client.submit(["a"], on_hang="sometimes")
        with self.assertRaisesRegex(TypeError, "hang_timeout must be a number"):
            client.submit(["a"], hang_timeout="5m")
        for bad in (0, -1.5, float("inf")):
            with self.assertRaisesRegex(meshrt.InvalidArgumentError, "hang_timeout must be a positive"):
                client.submit(["a"], hang_timeout=bad)
            with self.assertRaisesRegex(meshrt.InvalidArgumentError, "hang_timeout must be a positive"):
                client.create_job(1, hang_timeout=bad)
        with self.assertRaisesRegex(TypeError, "wait: timeout must be a number"):
            client.wait("j", timeout="soon")
        # Arguments of pybind11-typed parameters were TypeErrors already.
        with self.assertRaises(TypeError):
            client.logs("j", rank="0")

    def test_signatures_name_the_classes(self):
        doc = meshrt.init.__doc__
        self.assertIn("-> meshrt._meshrt.Runtime", doc)
        self.assertNotIn("anonymous", doc)
        self.assertNotIn("::", doc)

    def test_unreachable_coordinator(self):
        start = time.monotonic()
        with self.assertRaises(meshrt.UnavailableError) as raised:
            meshrt.JobClient("127.0.0.1:1", timeout=5).list()
        self.assertEqual(raised.exception.code, "UNAVAILABLE")
        self.assertLess(time.monotonic() - start, 5)
        with self.assertRaises(meshrt.UnavailableError):
            meshrt.init(read_env=False, coordinator="127.0.0.1:1", job_id="j", generation=0,
                        rank=0, world_size=1, join_timeout=0.3)


class PlacementTest(unittest.TestCase):
    def test_values(self):
        S, R, P = meshrt.Shard, meshrt.Replicate, meshrt.Partial
        self.assertEqual(S(1), S(1))
        self.assertNotEqual(S(1), S(0))
        self.assertNotEqual(S(0), R())
        self.assertEqual(R(), R())
        self.assertEqual(P(), P("sum"))
        self.assertNotEqual(P("max"), P("sum"))
        self.assertEqual(P(meshrt.ReduceOp.AVG).reduce_op, "avg")
        self.assertEqual(repr(S(2)), "Shard(dim=2)")
        self.assertEqual(repr(P("max")), "Partial(reduce_op='max')")
        self.assertEqual(len({S(0), S(0), R()}), 2)
        self.assertTrue(S(3).is_shard() and S(3).is_shard(3) and not S(3).is_shard(1))
        self.assertTrue(R().is_replicate() and P().is_partial())
        self.assertIsInstance(S(0), meshrt.Placement)
        self.assertEqual(S(4).dim, 4)
        with self.assertRaises(meshrt.InvalidArgumentError):
            P("median")


class StubsTest(unittest.TestCase):
    def test_stubs_name_every_public_attribute(self):
        stub_path = os.path.join(os.path.dirname(meshrt.__file__), "_meshrt.pyi")
        with open(stub_path) as f:
            tree = ast.parse(f.read())
        stubbed = {}
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                members = set()
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        if isinstance(item, ast.FunctionDef):
                            members.add(item.name)
                        elif isinstance(item, ast.AnnAssign):
                            members.add(item.target.id)
                        elif isinstance(item, ast.Assign):
                            members.update(t.id for t in item.targets)
                stubbed[node.name] = members
        public = [name for name in dir(_meshrt) if not name.startswith("_")]
        for name in public:
            self.assertIn(name, stubbed, f"_meshrt.{name} has no stub")
            obj = getattr(_meshrt, name)
            if isinstance(obj, type) and not issubclass(obj, BaseException):
                for attr, value in vars(obj).items():
                    if attr.startswith("_"):
                        continue
                    self.assertIn(attr, stubbed[name], f"_meshrt.{name}.{attr} has no stub")
        self.assertEqual(sorted(meshrt.__all__), sorted(public))

    def test_reduce_op_stub_matches_the_pybind11_enum(self):
        stub_path = os.path.join(os.path.dirname(meshrt.__file__), "_meshrt.pyi")
        with open(stub_path) as f:
            tree = ast.parse(f.read())
        (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ReduceOp"]
        # Not an enum.Enum (pybind11's enums are not), so no Enum base.
        self.assertFalse(issubclass(meshrt.ReduceOp, enum.Enum))
        self.assertEqual(cls.bases, [])
        members = {item.target.id for item in cls.body if isinstance(item, ast.AnnAssign)}
        self.assertLessEqual(set(meshrt.ReduceOp.__members__), members)
        for member in meshrt.ReduceOp.__members__.values():
            self.assertIsInstance(member, meshrt.ReduceOp)
            self.assertIsInstance(member.value, int)


if __name__ == "__main__":
    unittest.main()
