-- parked-for-an-approval: recorded by `python -m tests.golden.record` at c076284-dirty. Never edit it.
PRAGMA user_version = 1;
BEGIN TRANSACTION;
CREATE TABLE tether_answers (
  run_id TEXT NOT NULL, call_key TEXT NOT NULL, call_id TEXT NOT NULL, kind TEXT NOT NULL,
  tool TEXT NOT NULL, input_summary TEXT NOT NULL, parked_at REAL NOT NULL,
  answer TEXT, answered_at REAL,
  PRIMARY KEY (run_id, call_key)) WITHOUT ROWID;
INSERT INTO "tether_answers" VALUES('r1','212b6380-1526-47a3-8eae-41edb3ef59d3/call_0_0','call_0_0','approval','ship','{"content":"v1","path":"shipped.txt"}',1.79653309239280128475e+09,NULL,NULL);
CREATE TABLE tether_budget_calls (
  tree TEXT NOT NULL, key TEXT NOT NULL, cost_usd REAL NOT NULL, tokens INTEGER NOT NULL,
  settled INTEGER NOT NULL, PRIMARY KEY (tree, key)) WITHOUT ROWID;
CREATE TABLE tether_budgets (tree TEXT PRIMARY KEY, limits TEXT NOT NULL);
CREATE TABLE tether_runs (
  run_id TEXT PRIMARY KEY, status TEXT NOT NULL, owner TEXT,
  created_at REAL NOT NULL, updated_at REAL NOT NULL);
INSERT INTO "tether_runs" VALUES('r1','parked','pid 19704',1.79653309238772583003e+12,1.79653309239343457028e+12);
CREATE TABLE tether_session_runs (
  session_id TEXT NOT NULL, run_id TEXT NOT NULL, started_at REAL NOT NULL, data TEXT NOT NULL,
  PRIMARY KEY (session_id, run_id)) WITHOUT ROWID;
INSERT INTO "tether_session_runs" VALUES('r1','212b6380-1526-47a3-8eae-41edb3ef59d3',1.79653309239045800779e+12,'{"id":"212b6380-1526-47a3-8eae-41edb3ef59d3","status":"running","started_at":1796533092390.458,"ended_at":null,"prompt":"ship it","stats":null,"parent_run_id":null,"parent_call_id":null,"decisions":[]}');
CREATE TABLE tether_sessions (
  id TEXT PRIMARY KEY, created_at REAL NOT NULL, metadata TEXT NOT NULL);
INSERT INTO "tether_sessions" VALUES('r1',1.79653309238987622066e+12,'{}');
CREATE TABLE tether_steps (
  run_id TEXT NOT NULL, scope TEXT NOT NULL, seq INTEGER NOT NULL,
  kind TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, at REAL NOT NULL,
  PRIMARY KEY (run_id, scope, seq)) WITHOUT ROWID;
INSERT INTO "tether_steps" VALUES('r1','',0,'decision','cli:prompt',X'227368697020697422',1.7965330923887131348e+12);
INSERT INTO "tether_steps" VALUES('r1','',1,'state','session-load:r1',X'2D31',1.79653309238926684569e+12);
INSERT INTO "tether_steps" VALUES('r1','',2,'state','session-load:r1',X'2D31',1.79653309238959716796e+12);
INSERT INTO "tether_steps" VALUES('r1','',3,'clock','clock:1',X'313739363533333039323338392E38373632',1.79653309238988061528e+12);
INSERT INTO "tether_steps" VALUES('r1','',4,'clock','clock:2',X'313739363533333039323339302E343538',1.79653309239046289061e+12);
INSERT INTO "tether_steps" VALUES('r1','',5,'model','model:0:0',X'7B22636F6E74656E74223A5B7B2274797065223A22746F6F6C5F757365222C226964223A2263616C6C5F305F30222C226E616D65223A2273686970222C22696E707574223A7B22636F6E74656E74223A227631222C2270617468223A22736869707065642E747874227D7D5D2C227573616765223A7B22696E707574223A31302C226F7574707574223A317D2C2273746F70223A22746F6F6C5F757365222C22636F7374223A302E302C226C6174656E63795F6D73223A302E30363938323432313837352C226174223A313739363533333039323339312E313536357D',1.79653309239127124017e+12);
INSERT INTO "tether_steps" VALUES('r1','',6,'decision','tool-check:call_0_0',X'7B22616C6C6F776564223A747275652C226174223A313739363533333039323339322E323230377D',1.7965330923922290039e+12);
CREATE TABLE tether_tool_state (
  session_id TEXT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
  PRIMARY KEY (session_id, tool, key)) WITHOUT ROWID;
CREATE TABLE tether_turns (
  session_id TEXT NOT NULL, position INTEGER NOT NULL, id TEXT NOT NULL, role TEXT NOT NULL,
  content TEXT NOT NULL, usage TEXT, created_at REAL NOT NULL, run_id TEXT,
  PRIMARY KEY (session_id, position)) WITHOUT ROWID;
INSERT INTO "tether_turns" VALUES('r1',0,'bf62dd39-9471-43b9-824b-024e10dd2208','user','[{"type":"text","text":"ship it"}]',NULL,1.79653309239045800779e+12,'212b6380-1526-47a3-8eae-41edb3ef59d3');
INSERT INTO "tether_turns" VALUES('r1',1,'5d9a56f3-13bb-4fce-b5e7-c2ae6dcaea3d','assistant','[{"type":"tool_use","id":"call_0_0","name":"ship","input":{"content":"v1","path":"shipped.txt"}}]','{"input":10,"output":1}',1.79653309239115649411e+12,'212b6380-1526-47a3-8eae-41edb3ef59d3');
COMMIT;
