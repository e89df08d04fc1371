"""The scripted half of bench/speculative.py's agent session: a coding task in the shape agents work
(read the files, write one back with a fix, run the tests, read the failure, write it again, run
them again), its user and tool messages fixed here; the assistant's messages are the model's own,
recorded once (`python bench/speculative.py record`) into bench/speculative_session.json.
"""

from __future__ import annotations

SYSTEM = """You are a coding agent working in a Python project. You can use three tools:
- read_file(path): returns the file's text
- write_file(path, content): replaces the file with `content`
- run(command): runs a shell command and returns its output
To use a tool, answer with one JSON object such as {"tool": "read_file", "args": {"path": "app.py"}} and nothing
else. When a file must change, write the whole file with write_file. When the task is done, say so in one sentence."""

INVENTORY = '''"""A small inventory: items with a price and a quantity, and what they are worth."""

from dataclasses import dataclass, field


@dataclass
class Item:
    name: str
    price: float
    quantity: int = 1


@dataclass
class Inventory:
    items: list[Item] = field(default_factory=list)

    def add(self, name: str, price: float, quantity: int = 1) -> Item:
        for item in self.items:
            if item.name == name:
                item.quantity += quantity
                return item
        item = Item(name, price, quantity)
        self.items.append(item)
        return item

    def remove(self, name: str, quantity: int = 1) -> None:
        for item in self.items:
            if item.name == name:
                item.quantity -= quantity
                if item.quantity <= 0:
                    self.items.remove(item)
                return
        raise KeyError(name)

    def total(self) -> float:
        total = 0.0
        for item in self.items:
            total += item.price
        return total

    def names(self) -> list[str]:
        return sorted(item.name for item in self.items)
'''

FIXED = INVENTORY.replace("total += item.price\n", "total += item.price * item.quantity\n")

TESTS = '''from inventory import Inventory


def test_total_counts_quantities():
    inventory = Inventory()
    inventory.add("apple", 0.5, 4)
    inventory.add("pear", 0.75, 2)
    assert inventory.total() == 3.5


def test_adding_again_adds_to_the_quantity():
    inventory = Inventory()
    inventory.add("apple", 0.5)
    inventory.add("apple", 0.5, 2)
    assert inventory.items[0].quantity == 3


def test_removing_everything_forgets_the_item():
    inventory = Inventory()
    inventory.add("apple", 0.5, 2)
    inventory.remove("apple", 2)
    assert inventory.names() == []
'''

FAILED = '''============================= test session starts ==============================
collected 3 items

test_inventory.py F..                                                    [100%]

=================================== FAILURES ===================================
_________________________ test_total_counts_quantities _________________________

    def test_total_counts_quantities():
        inventory = Inventory()
        inventory.add("apple", 0.5, 4)
        inventory.add("pear", 0.75, 2)
>       assert inventory.total() == 3.5
E       assert 1.25 == 3.5
E        +  where 1.25 = <bound method Inventory.total of Inventory(items=[Item(name='apple', price=0.5, quantity=4), Item(name='pear', price=0.75, quantity=2)])>()

test_inventory.py:8: AssertionError
=========================== short test summary info ============================
FAILED test_inventory.py::test_total_counts_quantities - assert 1.25 == 3.5
========================= 1 failed, 2 passed in 0.02s ==========================
'''

PASSED = '''============================= test session starts ==============================
collected 3 items

test_inventory.py ...                                                    [100%]

============================== 3 passed in 0.01s ===============================
'''

# Each entry is what comes before one answer of the assistant's: the messages of the user and the
# tools after its last answer (a tool's result as the tool role's message, then the user's nudge: a
# model of 135M parameters follows a plain instruction better than a protocol).
CALL = " Answer with the JSON tool call only."
STEPS: list[list[dict]] = [
    [{"role": "system", "content": SYSTEM},
     {"role": "user", "content": "The tests in test_inventory.py fail. Find out why and fix inventory.py. Start by "
                                 "reading test_inventory.py." + CALL}],
    [{"role": "tool", "content": TESTS}, {"role": "user", "content": "Now read inventory.py." + CALL}],
    [{"role": "tool", "content": INVENTORY},
     {"role": "user", "content": "Run the tests with pytest -q." + CALL}],
    [{"role": "tool", "content": FAILED},
     {"role": "user", "content": "Which line of inventory.py is wrong, and why? Quote it."}],
    [{"role": "user", "content": "total() adds each price once, whatever the quantity. Write the whole of "
                                 "inventory.py back, unchanged except that total() multiplies the price by the "
                                 "quantity, in a Python code block."}],
    [{"role": "tool", "content": "wrote inventory.py"},
     {"role": "user", "content": "Run the tests again." + CALL}],
    [{"role": "tool", "content": PASSED},
     {"role": "user", "content": "Good. Now add a method `count(self) -> int` that returns how many items there are "
                                 "in all (the sum of the quantities), and write the whole file again."}],
    [{"role": "user", "content": "Summarise what you changed, in two sentences."}],
]

PROSE = [{"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}]
# A copying turn on its own, as the llama.cpp report that started issue 29 tried it: a file asked back.
COPY = [{"role": "user", "content": f"Write this file back exactly as it is, in a Python code block:\n\n"
                                    f"```python\n{INVENTORY}```"}]
