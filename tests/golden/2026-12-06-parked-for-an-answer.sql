-- recorded by `python -m tests.golden.record` at 78d0b42-dirty. Never edit it.
PRAGMA user_version = 1;
BEGIN TRANSACTION;
CREATE TABLE tether_answers (
  run_id TEXT NOT NULL, call_key TEXT NOT NULL, call_id TEXT NOT NULL, kind TEXT NOT NULL,
  tool TEXT NOT NULL, input_summary TEXT NOT NULL, parked_at REAL NOT NULL,
  answer TEXT, answered_at REAL,
  PRIMARY KEY (run_id, call_key)) WITHOUT ROWID;
INSERT INTO "tether_answers" VALUES('r1','212b6380-1526-47a3-8eae-41edb3ef59d3/call_0_0','call_0_0','ask_human','ask','{"question":"Which color?"}',1.79653398342482042309e+09,NULL,NULL);
CREATE TABLE tether_budget_calls (
  tree TEXT NOT NULL, key TEXT NOT NULL, cost_usd REAL NOT NULL, tokens INTEGER NOT NULL,
  settled INTEGER NOT NULL, PRIMARY KEY (tree, key)) WITHOUT ROWID;
CREATE TABLE tether_budgets (tree TEXT PRIMARY KEY, limits TEXT NOT NULL);
CREATE TABLE tether_runs (
  run_id TEXT PRIMARY KEY, status TEXT NOT NULL, owner TEXT,
  created_at REAL NOT NULL, updated_at REAL NOT NULL);
INSERT INTO "tether_runs" VALUES('r1','parked','pid 1293',1.79653398342029248053e+12,1.79653398342533740235e+12);
CREATE TABLE tether_session_runs (
  session_id TEXT NOT NULL, run_id TEXT NOT NULL, started_at REAL NOT NULL, data TEXT NOT NULL,
  PRIMARY KEY (session_id, run_id)) WITHOUT ROWID;
INSERT INTO "tether_session_runs" VALUES('r1','212b6380-1526-47a3-8eae-41edb3ef59d3',1.79653398342265624995e+12,'{"id":"212b6380-1526-47a3-8eae-41edb3ef59d3","status":"running","started_at":1796533983422.6562,"ended_at":null,"prompt":"pick a color","stats":null,"parent_run_id":null,"parent_call_id":null,"decisions":[]}');
CREATE TABLE tether_sessions (
  id TEXT PRIMARY KEY, created_at REAL NOT NULL, metadata TEXT NOT NULL);
INSERT INTO "tether_sessions" VALUES('r1',1.79653398342214721682e+12,'{}');
CREATE TABLE tether_steps (
  run_id TEXT NOT NULL, scope TEXT NOT NULL, seq INTEGER NOT NULL,
  kind TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, at REAL NOT NULL,
  PRIMARY KEY (run_id, scope, seq)) WITHOUT ROWID;
INSERT INTO "tether_steps" VALUES('r1','',0,'decision','cli:prompt',X'227069636B206120636F6C6F7222',1.796533983421019043e+12);
INSERT INTO "tether_steps" VALUES('r1','',1,'state','session-load:r1',X'2D31',1.79653398342150244135e+12);
INSERT INTO "tether_steps" VALUES('r1','',2,'state','session-load:r1',X'2D31',1.79653398342186425783e+12);
INSERT INTO "tether_steps" VALUES('r1','',3,'clock','clock:1',X'313739363533333938333432322E31343732',1.79653398342215112311e+12);
INSERT INTO "tether_steps" VALUES('r1','',4,'clock','clock:2',X'313739363533333938333432322E36353632',1796533983422.66);
INSERT INTO "tether_steps" VALUES('r1','',5,'model','model:0:0',X'7B22636F6E74656E74223A5B7B2274797065223A22746F6F6C5F757365222C226964223A2263616C6C5F305F30222C226E616D65223A2261736B222C22696E707574223A7B227175657374696F6E223A22576869636820636F6C6F723F227D7D5D2C227573616765223A7B22696E707574223A31302C226F7574707574223A317D2C2273746F70223A22746F6F6C5F757365222C22636F7374223A302E302C226C6174656E63795F6D73223A302E3033393330363634303632352C226174223A313739363533333938333432332E3232337D',1.79653398342344238283e+12);
INSERT INTO "tether_steps" VALUES('r1','',6,'decision','tool-check:call_0_0',X'7B22616C6C6F776564223A747275652C226174223A313739363533333938333432342E313334337D',1.79653398342413867187e+12);
CREATE TABLE tether_tool_state (
  session_id TEXT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
  PRIMARY KEY (session_id, tool, key)) WITHOUT ROWID;
CREATE TABLE tether_turns (
  session_id TEXT NOT NULL, position INTEGER NOT NULL, id TEXT NOT NULL, role TEXT NOT NULL,
  content TEXT NOT NULL, usage TEXT, created_at REAL NOT NULL, run_id TEXT,
  PRIMARY KEY (session_id, position)) WITHOUT ROWID;
INSERT INTO "tether_turns" VALUES('r1',0,'bf62dd39-9471-43b9-824b-024e10dd2208','user','[{"type":"text","text":"pick a color"}]',NULL,1.79653398342265624995e+12,'212b6380-1526-47a3-8eae-41edb3ef59d3');
INSERT INTO "tether_turns" VALUES('r1',1,'5d9a56f3-13bb-4fce-b5e7-c2ae6dcaea3d','assistant','[{"type":"tool_use","id":"call_0_0","name":"ask","input":{"question":"Which color?"}}]','{"input":10,"output":1}',1.79653398342322290041e+12,'212b6380-1526-47a3-8eae-41edb3ef59d3');
COMMIT;
